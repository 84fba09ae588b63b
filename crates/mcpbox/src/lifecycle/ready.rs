//! Workspaces made ahead of demand (`[[templates]] ready`, issue 28).
//!
//! A new task's sandbox needs a workspace: its folders, a volume image
//! formatted by `mkfs.ext4` (crate::volume), the template's base copied
//! into `input`. Made on the session's path, that is most of what a fresh
//! sandbox costs before its server starts. So for each server made from a
//! template, a background thread keeps `ready` of them made, and a new
//! sandbox takes one and renames it to its own folder.
//!
//! The rules, each for a reason:
//! - **Made by mcpbox alone, seen by nobody.** A ready workspace is
//!   `<state>/sandboxes/.ready-<12 hex>` (0700, like every workspace); no
//!   sandbox mounts it and no record names it until it is taken.
//! - **Mounted only where the mount can follow.** As root its volume
//!   waits mounted on its loop device: a rename moves the mount with the
//!   folder, and the loop device names its backing file by its path now
//!   (`/sys/dev/block/*/loop/backing_file`), so crate::volume's `ensure`
//!   finds it mounted, and mounting (a few milliseconds) is off the
//!   session's path too. A `fuse2fs` mount (rootless) is known by the path
//!   it was started with, so there the image waits unmounted and the
//!   sandbox that takes it mounts it, as for any kept workspace.
//! - **Used once.** It is taken by exactly one new sandbox and never comes
//!   back: a sandbox's workspace is destroyed with it as before. So no two
//!   agents, tasks or sandboxes ever share one.
//! - **The template as it is now.** Each keeps a stamp of the template's
//!   base when it was made (every entry's path, type, size, mode, inode,
//!   mtime and ctime; for a snapshot archive the file's); one whose stamp
//!   no longer matches the base at take time is removed, not used, and
//!   the sandbox makes its own.
//! - **Gone when unused.** `serve` stopping removes them (a volume
//!   unmounted first, as for every workspace); a killed run's are removed
//!   at the next start (`Lifecycle::recover`: every `.ready-*` folder).
//! - **Bounded.** At most [`mcpbox_policy::serve::MAX_READY`] per server;
//!   one that fails to be made (a full disk, no `mkfs.ext4`) is retried
//!   after [`RETRY`], not in a loop.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use mcpbox_policy::serve::TemplateBase;

use super::workspace::Workspace;
use super::ServerLife;

/// The folder name prefix of a ready workspace under `<state>/sandboxes`.
pub const PREFIX: &str = ".ready-";

/// The suffix of one while it is being made.
pub const MAKING: &str = ".making";

/// How long a server whose ready workspace could not be made waits
/// before the next try.
pub const RETRY: Duration = Duration::from_secs(10);

/// How long after a take the next one is made: the session that took it
/// is starting its server meanwhile (namespaces, exec), and `mkfs.ext4`
/// and the copy beside it would slow that start on a small machine.
pub const SETTLE: Duration = Duration::from_millis(250);

/// A template's base as it was: SHA-256 over every entry's fields, so
/// that each ready workspace holds 32 bytes of it, whatever the base's
/// size.
type Stamp = [u8; 32];

/// One ready workspace and the stamp of the base it was copied from.
struct Made {
    ws: Workspace,
    stamp: Stamp,
}

/// What one server keeps ready (`life.ready` of them).
struct Stock {
    life: ServerLife,
    size: Option<u64>,
    made: Vec<Made>,
    /// Not before this, after a failure or a take.
    next_try: Option<Instant>,
    /// The last failure's root cause, so that one that repeats every
    /// [`RETRY`] is logged once.
    failed: Option<String>,
}

struct Inner {
    stocks: HashMap<String, Stock>,
    stopping: bool,
}

/// The ready workspaces of every server that asks for them.
pub struct Ready {
    dir: PathBuf,
    inner: Mutex<Inner>,
    wake: Condvar,
    /// The thread that makes them, joined by [`Ready::stop`] so that one
    /// it was making when `serve` stopped is removed before the exit.
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

fn lock(m: &Mutex<Inner>) -> MutexGuard<'_, Inner> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Ready {
    /// Keeps `life.ready` workspaces (of `size`) ready for each `(server,
    /// life, size)` whose life has a template, under `dir`
    /// (`<state>/sandboxes`), made by a background thread from now on.
    pub fn start(
        dir: PathBuf,
        servers: Vec<(String, ServerLife, Option<u64>)>,
    ) -> anyhow::Result<Arc<Ready>> {
        let stocks = servers
            .into_iter()
            .filter(|(_, life, _)| life.template.is_some() && life.ready > 0)
            .map(|(name, life, size)| {
                let stock = Stock {
                    life,
                    size,
                    made: Vec::new(),
                    next_try: None,
                    failed: None,
                };
                (name, stock)
            })
            .collect::<HashMap<_, _>>();
        let idle = stocks.is_empty();
        let ready = Arc::new(Ready {
            dir,
            inner: Mutex::new(Inner {
                stocks,
                stopping: false,
            }),
            wake: Condvar::new(),
            thread: Mutex::new(None),
        });
        if !idle {
            let me = ready.clone();
            let handle = std::thread::Builder::new()
                .name("mcpbox-ready".into())
                .spawn(move || me.fill_loop())?;
            *ready.thread.lock().unwrap_or_else(|p| p.into_inner()) = Some(handle);
        }
        Ok(ready)
    }

    /// A ready workspace of `server`'s, renamed to `to` (which must not
    /// exist), if one is ready and made from the template as it is now;
    /// `None` otherwise (the caller makes its own). Wakes the thread that
    /// makes the next one.
    pub fn take(&self, server: &str, to: &Path) -> Option<Workspace> {
        let (made, base) = {
            let mut g = lock(&self.inner);
            let stock = g.stocks.get_mut(server)?;
            let base = stock.life.template.as_ref()?.1.clone();
            let made = if stock.made.is_empty() {
                None
            } else {
                Some(stock.made.remove(0))
            };
            // the next one is made once this session's server started
            let settle = Instant::now() + SETTLE;
            stock.next_try = Some(stock.next_try.map_or(settle, |t| t.max(settle)));
            (made, base)
        };
        self.wake.notify_all();
        let made = made?;
        let now = stamp(&base);
        if now != made.stamp {
            tracing::info!(
                server,
                "the template changed since its ready workspace was made: making a new one"
            );
            remove(&made.ws);
            // the others were made from the same older base
            self.discard_stale(server, &now);
            return None;
        }
        match rename_new(&made.ws.root, to) {
            Ok(()) => Some(Workspace::at(to.to_path_buf())),
            Err(e) => {
                tracing::warn!(server, error = %e, to = %to.display(), "taking a ready workspace");
                remove(&made.ws);
                None
            }
        }
    }

    /// How many are ready for `server` now (for tests).
    #[cfg(test)]
    pub fn count(&self, server: &str) -> usize {
        lock(&self.inner)
            .stocks
            .get(server)
            .map_or(0, |s| s.made.len())
    }

    /// Stops making them and removes every ready one (`serve` stopping):
    /// the one being made, if any, is finished and removed by its thread,
    /// which this waits for.
    pub fn stop(&self) {
        let all: Vec<Made> = {
            let mut g = lock(&self.inner);
            g.stopping = true;
            g.stocks
                .values_mut()
                .flat_map(|s| std::mem::take(&mut s.made))
                .collect()
        };
        self.wake.notify_all();
        for made in all {
            remove(&made.ws);
        }
        let thread = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(t) = thread {
            if t.join().is_err() {
                tracing::warn!("the thread that makes ready workspaces panicked");
            }
        }
    }

    /// Removes `server`'s ready workspaces made from another base than
    /// the one stamped `now`.
    fn discard_stale(&self, server: &str, now: &Stamp) {
        let stale: Vec<Made> = {
            let mut g = lock(&self.inner);
            let Some(stock) = g.stocks.get_mut(server) else {
                return;
            };
            let (keep, stale) = std::mem::take(&mut stock.made)
                .into_iter()
                .partition(|m| m.stamp == *now);
            stock.made = keep;
            stale
        };
        for made in stale {
            remove(&made.ws);
        }
    }

    /// The background thread: makes one workspace at a time for a server
    /// short of its `wanted`, sleeps when none is.
    fn fill_loop(self: Arc<Self>) {
        // background work, and mkfs.ext4 and the copy inherit it: a
        // session's server starting beside it wins the CPU
        mcpbox_gateway::background_priority();
        loop {
            let job = {
                let mut g = lock(&self.inner);
                loop {
                    if g.stopping {
                        return;
                    }
                    let now = Instant::now();
                    let due = g.stocks.iter().find(|(_, s)| {
                        s.made.len() < s.life.ready && s.next_try.is_none_or(|t| t <= now)
                    });
                    if let Some((name, s)) = due {
                        break (name.clone(), s.life.clone(), s.size);
                    }
                    // until the first short server's time comes (a retry,
                    // or a take's settling), or a take or a stop wakes it
                    let wait = g
                        .stocks
                        .values()
                        .filter(|s| s.made.len() < s.life.ready)
                        .filter_map(|s| s.next_try)
                        .map(|t| t.saturating_duration_since(now))
                        .min()
                        .unwrap_or(RETRY)
                        .clamp(Duration::from_millis(1), RETRY);
                    g = self
                        .wake
                        .wait_timeout(g, wait)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
            };
            let (server, life, size) = job;
            let made = self.make(&life, size);
            let mut g = lock(&self.inner);
            let stopping = g.stopping;
            match (made, g.stocks.get_mut(&server)) {
                (Ok(Some(made)), Some(stock)) if !stopping => {
                    stock.made.push(made);
                    stock.next_try = None;
                    if stock.failed.take().is_some() {
                        tracing::info!(server, "ready workspaces are made again");
                    }
                }
                (Ok(Some(made)), _) => {
                    drop(g);
                    remove(&made.ws);
                }
                // the base changed while it was copied: made again at once
                (Ok(None), _) => {}
                (Err(e), stock) => {
                    // known by its root cause: the chain names the new
                    // folder, which differs at each try
                    let why = e.root_cause().to_string();
                    let again = stock
                        .as_ref()
                        .is_some_and(|s| s.failed.as_deref() == Some(why.as_str()));
                    if again {
                        tracing::debug!(server, "making a ready workspace: {e:#}");
                    } else {
                        tracing::warn!(
                            server,
                            "making a ready workspace: {e:#}; retried every {}s (a new sandbox makes its own meanwhile)",
                            RETRY.as_secs()
                        );
                    }
                    if let Some(stock) = stock {
                        stock.next_try = Some(Instant::now() + RETRY);
                        stock.failed = Some(why);
                    }
                }
            }
        }
    }

    /// One ready workspace for `life`, made as a new sandbox's would be
    /// (`super::fill`); a `fuse2fs` volume then unmounted (see the module
    /// doc).
    ///
    /// It is made as `.ready-<id>.making` and renamed to `.ready-<id>`
    /// once whole, so that what is ready on disk is what is ready here.
    /// `None` when the base changed while it was copied (it is removed).
    fn make(&self, life: &ServerLife, size: Option<u64>) -> anyhow::Result<Option<Made>> {
        let base = life
            .template
            .as_ref()
            .map(|(_, b)| b.clone())
            .ok_or_else(|| anyhow::anyhow!("no template"))?;
        let name = format!("{PREFIX}{}", crate::state::new_id());
        let making = Workspace::at(self.dir.join(format!("{name}{MAKING}")));
        let ws = Workspace::at(self.dir.join(&name));
        // stamped before the copy, and again after it
        let before = stamp(&base);
        let made = super::fill(&making, life, size)
            .and_then(|()| {
                if crate::volume::bound() == crate::volume::Bound::Fuse {
                    making.unmount()
                } else {
                    Ok(())
                }
            })
            .and_then(|()| {
                rename_new(&making.root, &ws.root)
                    .map_err(|e| anyhow::anyhow!("renaming {}: {e}", making.root.display()))
            });
        if let Err(e) = made {
            remove(&making);
            return Err(e);
        }
        if stamp(&base) != before {
            remove(&ws);
            return Ok(None);
        }
        Ok(Some(Made { ws, stamp: before }))
    }
}

/// Removes a ready workspace (its volume unmounted first, should one be
/// mounted); a failure is logged, the next start's recover retries it.
fn remove(ws: &Workspace) {
    if let Err(e) = ws.remove() {
        tracing::warn!(workspace = %ws.root.display(), "removing a ready workspace: {e:#}");
    }
}

/// The stamp of a template's base: each entry a copy would take (the same
/// walk as `workspace::copy_template`: directories and regular files,
/// sorted, at most 64 deep) with its type, size, mode, inode, mtime and
/// ctime, so that an edit, a replaced file or a touched one all show.
/// An unreadable base stamps as no entry at all, which matches nothing
/// made from a readable one (that has its root, at least).
pub fn stamp(base: &TemplateBase) -> Stamp {
    use sha2::{Digest, Sha256};
    use std::os::unix::ffi::OsStrExt;
    let mut h = Sha256::new();
    let (TemplateBase::Dir(root) | TemplateBase::Snapshot(root)) = base;
    let _ = super::workspace::walk_template(root, &mut |e| {
        // the path's length first: no two lists of entries hash alike
        let path = e.rel.as_os_str().as_bytes();
        h.update((path.len() as u64).to_le_bytes());
        h.update(path);
        for n in stamp_fields(e.stat) {
            h.update(n.to_le_bytes());
        }
        Ok(())
    });
    h.finalize().into()
}

/// Renames `from` to `to`, which must not exist: rename(2) alone replaces
/// an empty directory, and a ready workspace is handed over whole or not
/// at all (renameat2(2) `RENAME_NOREPLACE`: EEXIST instead).
fn rename_new(from: &Path, to: &Path) -> std::io::Result<()> {
    use rustix::fs::{renameat_with, RenameFlags, CWD};
    Ok(renameat_with(CWD, from, CWD, to, RenameFlags::NOREPLACE)?)
}

/// What a stamp takes of an entry's lstat, as i64: mode, size, inode and
/// both times (their widths differ between architectures and rustix's
/// backends, hence the conversions that are no-ops here).
#[allow(clippy::useless_conversion, clippy::unnecessary_fallible_conversions)]
fn stamp_fields(st: &rustix::fs::Stat) -> [i64; 7] {
    let wide = |n: i128| i64::try_from(n).unwrap_or(i64::MAX);
    [
        i64::from(st.st_mode),
        wide(i128::from(st.st_size)),
        wide(i128::from(st.st_ino)),
        wide(i128::from(st.st_mtime)),
        wide(i128::from(st.st_mtime_nsec)),
        wide(i128::from(st.st_ctime)),
        wide(i128::from(st.st_ctime_nsec)),
    ]
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use mcpbox_audit::MemorySink;
    use mcpbox_policy::serve::Idle;

    /// A life made from the template at `base`, with no volume (size
    /// `None`: plain folders, which is what a unit test may make).
    fn life(base: &Path) -> ServerLife {
        ServerLife {
            group: "s".into(),
            idle: Idle {
                pause: None,
                stop: None,
                destroy: None,
            },
            template: Some(("t".into(), TemplateBase::Dir(base.to_path_buf()))),
            ready: 2,
            artifacts: (Vec::new(), 0),
            revoke: Vec::new(),
            audit: Arc::new(MemorySink::default()),
            workspace_size: 0,
            allow_unbounded_disk: true,
        }
    }

    fn until(what: &str, f: impl Fn() -> bool) {
        let end = Instant::now() + Duration::from_secs(20);
        while !f() {
            assert!(Instant::now() < end, "{what}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Ready workspaces on disk, whole or being made.
    fn ready_dirs(dir: &Path) -> usize {
        std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(PREFIX))
            .count()
    }

    #[test]
    fn a_taken_workspace_is_renamed_once_and_replaced_and_a_stop_removes_the_rest() {
        let tmp = tempfile::tempdir().unwrap();
        let base = tmp.path().join("base");
        std::fs::create_dir_all(base.join("sub")).unwrap();
        std::fs::write(base.join("sub/seed.txt"), "seed").unwrap();
        let dir = tmp.path().join("sandboxes");
        std::fs::create_dir(&dir).unwrap();
        let ready = Ready::start(dir.clone(), vec![("s".into(), life(&base), None)]).unwrap();
        until("two ready", || ready.count("s") == 2);
        // a server with none asked for, or an unknown one, takes nothing
        assert!(ready.take("other", &dir.join("x")).is_none());
        let to = dir.join("sb-1");
        let ws = ready.take("s", &to).unwrap();
        assert_eq!(ws.root, to);
        assert_eq!(
            std::fs::read_to_string(to.join("input/sub/seed.txt")).unwrap(),
            "seed"
        );
        // gone from the ready ones; another is made after SETTLE
        assert_eq!(ready.count("s"), 1);
        until("replaced", || ready.count("s") == 2);
        assert_eq!(ready_dirs(&dir), 2);
        // a destination that exists already is not written over: that
        // ready one is removed, and the caller makes its own
        std::fs::create_dir(dir.join("sb-2")).unwrap();
        std::fs::write(dir.join("sb-2/mine"), "kept").unwrap();
        assert!(ready.take("s", &dir.join("sb-2")).is_none());
        assert_eq!(
            std::fs::read_to_string(dir.join("sb-2/mine")).unwrap(),
            "kept"
        );
        // nor one that is there and empty (rename(2) alone would replace it)
        until("replaced again", || ready.count("s") == 2);
        std::fs::create_dir(dir.join("sb-3")).unwrap();
        use std::os::unix::fs::MetadataExt;
        let empty = std::fs::metadata(dir.join("sb-3")).unwrap().ino();
        assert!(ready.take("s", &dir.join("sb-3")).is_none());
        assert_eq!(std::fs::metadata(dir.join("sb-3")).unwrap().ino(), empty);
        ready.stop();
        assert_eq!(ready_dirs(&dir), 0);
        assert!(
            to.join("input/sub/seed.txt").is_file(),
            "a taken one is the sandbox's"
        );
        // nothing is made after a stop
        std::thread::sleep(SETTLE * 2);
        assert_eq!(ready_dirs(&dir), 0);
    }

    #[test]
    fn a_ready_workspace_of_an_older_base_is_removed_not_taken() {
        let tmp = tempfile::tempdir().unwrap();
        let base = tmp.path().join("base");
        std::fs::create_dir(&base).unwrap();
        std::fs::write(base.join("seed.txt"), "old!").unwrap();
        let dir = tmp.path().join("sandboxes");
        std::fs::create_dir(&dir).unwrap();
        let ready = Ready::start(dir.clone(), vec![("s".into(), life(&base), None)]).unwrap();
        until("two ready", || ready.count("s") == 2);
        // the same size and, most likely, the same second
        std::fs::write(base.join("seed.txt"), "new!").unwrap();
        assert!(ready.take("s", &dir.join("sb-1")).is_none());
        assert!(!dir.join("sb-1").exists());
        // both stale ones went; the new ones are of the new base
        until("remade", || ready.count("s") == 2);
        let ws = ready.take("s", &dir.join("sb-2")).unwrap();
        assert_eq!(
            std::fs::read_to_string(ws.input().join("seed.txt")).unwrap(),
            "new!"
        );
        ready.stop();
    }

    #[test]
    fn a_base_that_cannot_be_copied_leaves_nothing_behind_and_gives_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("sandboxes");
        std::fs::create_dir(&dir).unwrap();
        let missing = tmp.path().join("gone");
        let ready = Ready::start(dir.clone(), vec![("s".into(), life(&missing), None)]).unwrap();
        until("a failed try", || {
            lock(&ready.inner).stocks["s"].failed.is_some()
        });
        // its next try waits RETRY: nothing made meanwhile, nothing left
        assert_eq!(ready_dirs(&dir), 0);
        assert!(ready.take("s", &dir.join("sb-1")).is_none());
        assert!(!dir.join("sb-1").exists());
        ready.stop();
    }

    #[test]
    fn a_stamp_sees_an_edit_an_added_file_and_a_replaced_one() {
        let tmp = tempfile::tempdir().unwrap();
        let base = TemplateBase::Dir(tmp.path().to_path_buf());
        std::fs::write(tmp.path().join("a"), "1").unwrap();
        let first = stamp(&base);
        assert_eq!(first, stamp(&base));
        std::fs::write(tmp.path().join("b"), "2").unwrap();
        let second = stamp(&base);
        assert_ne!(first, second);
        std::fs::write(tmp.path().join("b.new"), "2").unwrap();
        std::fs::rename(tmp.path().join("b.new"), tmp.path().join("b")).unwrap();
        assert_ne!(second, stamp(&base));
        // a base that cannot be read matches nothing made from one that can
        assert_ne!(
            stamp(&TemplateBase::Dir(tmp.path().join("missing"))),
            stamp(&base)
        );
    }
}
