//! The relay's helper threads: the server's stderr reader (redacted,
//! sanitized lines to the handler), the audit writer (at nice 10, batches
//! in order), the launcher (starts each server generation off the
//! driver's loop), and the session nonce.

use std::collections::VecDeque;
use std::io::Read;
use std::sync::mpsc::{self, Sender};
use std::sync::Arc;
use std::thread;

use mcpbox_audit::Sink;
use serde_json::{json, Value};

use super::source::Inbox;
use super::{spawn_named, Input, StderrHandler};
use crate::launcher::Launcher;
use crate::redact::StreamRedactor;
use crate::screen::sanitize;
use crate::secrets::Secrets;
use crate::session::supervise::{bounded_tail, STDERR_TAIL_LINES, STDERR_TAIL_LINE_BYTES};
use crate::session::{Event, Record};
use crate::Result;

pub(super) fn spawn_stderr(
    mut stderr: Box<dyn Read + Send>,
    redactor: crate::redact::Redactor,
    gen: u32,
    server: String,
    handler: StderrHandler,
    inbox: Inbox,
) -> Result<()> {
    spawn_named("mcpbox-server-err", move || {
        let names = redactor.names().to_vec();
        let mut stream = StreamRedactor::new(redactor, 8 * 1024);
        let mut buf = [0u8; 8192];
        // The last lines, as logged (redacted, sanitized), for the error
        // of a request the server leaves unanswered; bounded as it goes.
        let mut tail: VecDeque<String> = VecDeque::with_capacity(STDERR_TAIL_LINES + 1);
        let mut log = |line: &[u8]| {
            let text = String::from_utf8_lossy(line);
            let (clean, _) = sanitize(&text);
            handler(&server, &clean);
            let mut kept = clean.into_owned();
            if kept.len() > STDERR_TAIL_LINE_BYTES {
                let mut cut = STDERR_TAIL_LINE_BYTES;
                while !kept.is_char_boundary(cut) {
                    cut -= 1;
                }
                kept.truncate(cut);
            }
            if tail.len() == STDERR_TAIL_LINES {
                tail.pop_front();
            }
            tail.push_back(kept);
        };
        loop {
            match stderr.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => stream.push(&buf[..n], &mut log),
            }
        }
        stream.finish(&mut log);
        let tail = bounded_tail(tail.into());
        let redactions = names
            .into_iter()
            .zip(stream.counts.iter().copied())
            .filter(|(_, c)| *c > 0)
            .collect();
        let _ = inbox.send(Input::Event(Event::StderrClosed {
            gen,
            redactions,
            tail,
        }));
    })?;
    Ok(())
}

/// Records the audit writer takes into one write, at most (more only when
/// one input made more).
pub(super) const AUDIT_BATCH: usize = 256;

/// The audit writer: records in order, each call's `files_written` listed
/// when its record is written.
pub(super) fn spawn_audit(
    sink: Arc<dyn Sink>,
    output_dir: Option<std::path::PathBuf>,
    inbox: Inbox,
) -> Result<(Sender<Vec<Record>>, thread::JoinHandle<()>)> {
    let (tx, rx) = mpsc::channel::<Vec<Record>>();
    let handle = spawn_named("mcpbox-audit", move || {
        background_priority();
        // the session hears when the sink stops (or starts again) writing
        // everything: it refuses calls meanwhile
        let mut healthy = true;
        while let Ok(mut batch) = rx.recv() {
            // What queued while the last write ran goes in with it: one
            // SQLite transaction for all ([`Sink::record_all`]) costs about
            // what one record does (its WAL frames and locks), so a writer
            // that fell behind on a busy machine catches up instead of
            // taking CPU from the host path for each record. Nothing waits
            // for a batch to fill.
            while batch.len() < AUDIT_BATCH {
                match rx.try_recv() {
                    Ok(more) => batch.extend(more),
                    Err(_) => break,
                }
            }
            let events = batch
                .into_iter()
                .map(|record| {
                    let mut e = record.event;
                    if let Some(files) = &record.files {
                        // the kernel's list ([`crate::touched`]); digests now,
                        // off the host path
                        let (written, list) = crate::touched::describe(files);
                        e.files_written = written;
                        add_detail(&mut e.detail, |d| {
                            d.insert("files".into(), list);
                            if files.truncated {
                                d.insert("files_truncated".into(), json!(true));
                            }
                        });
                    } else if let (Some(since), Some(dir)) = (record.files_since, &output_dir) {
                        // Bounded (see [`crate::written`]).
                        let w = crate::written::files_written_since(dir, since);
                        e.files_written = w.paths;
                        if w.truncated {
                            // beside what the call's record already says
                            add_detail(&mut e.detail, |d| {
                                d.insert("files_written_truncated".into(), json!(true));
                            });
                        }
                    }
                    e
                })
                .collect();
            sink.record_all(events);
            let now = sink.healthy();
            if now != healthy {
                healthy = now;
                let _ = inbox.send(Input::Event(Event::AuditHealth { ok: now }));
            }
        }
    })?;
    Ok((tx, handle))
}

/// Lowers the calling thread's scheduling priority (nice 10; Linux applies
/// `setpriority` to one thread when given its tid, and what it starts
/// inherits it). The audit writer, and `serve`'s maker of ready workspaces,
/// are background work: on a busy machine the threads on the host's path
/// should win the CPU when they wake. Best effort: a failure changes
/// nothing else.
pub fn background_priority() {
    let tid = rustix::thread::gettid();
    if let Err(e) = rustix::process::setpriority_process(Some(tid), 10) {
        tracing::debug!("cannot lower a background thread's priority: {e}");
    }
}

/// The launcher thread: starts each server generation asked for.
pub(super) fn spawn_launcher(
    mut launcher: Box<dyn Launcher>,
    inbox: Inbox,
) -> Result<Sender<(u32, Secrets, bool)>> {
    let (launch_tx, rx) = mpsc::channel::<(u32, Secrets, bool)>();
    spawn_named("mcpbox-launcher", move || {
        for (gen, mut secrets, refresh) in rx {
            if refresh {
                for e in secrets.refresh() {
                    tracing::warn!("{e}");
                }
            }
            let result = launcher.launch(&secrets.env()).map(Box::new);
            let launched = Input::Launched {
                gen,
                result,
                secrets,
            };
            if !inbox.send(launched) {
                return;
            }
        }
    })?;
    Ok(launch_tx)
}

/// An unguessable per-session nonce for the ids of mcpbox's own requests
/// to the host, so a server cannot forge an approval answer by reusing an id.
pub(crate) fn make_nonce() -> String {
    let mut seed = [0u8; 16];
    let random = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut seed))
        .is_ok();
    let mut material = seed.to_vec();
    if !random {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        material.extend_from_slice(format!("{t:?}{}", std::process::id()).as_bytes());
    }
    crate::digest::sha256_hex(&material)[..24].to_string()
}

/// Adds to the record's detail (made an object if it was not).
fn add_detail(detail: &mut Value, add: impl FnOnce(&mut serde_json::Map<String, Value>)) {
    let mut map = match std::mem::take(detail) {
        Value::Object(m) => m,
        _ => serde_json::Map::new(),
    };
    add(&mut map);
    *detail = Value::Object(map);
}
