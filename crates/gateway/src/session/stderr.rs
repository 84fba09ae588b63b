//! The server's last stderr lines, kept for the error of a request it never
//! answered: bounded, and redacted again by the core before they go out.

use super::Session;
use crate::redact::{find_credentials, redact_credentials};

/// Most lines of the server's stderr kept for the error of a request it
/// never answered.
pub const STDERR_TAIL_LINES: usize = 10;
/// Most bytes of those lines, all together.
pub const STDERR_TAIL_BYTES: usize = 2048;
/// Most bytes of one of them (a longer line is cut), so that one long line
/// does not crowd out the others.
pub const STDERR_TAIL_LINE_BYTES: usize = 512;

impl Session {
    /// The server's last stderr lines as the host may see them: redacted
    /// of secret values and sanitized by the reader, redacted again here
    /// (the reader's redactor may be a generation old; this one knows every
    /// value, current and retired), and of credential shapes too when
    /// results are (`redact_credential_shapes`).
    pub(super) fn stderr_tail(&self) -> Vec<String> {
        let redact = self.config.redact_credential_shapes;
        let redactor = &self.redaction.redactor;
        let mut counts = vec![0; redactor.names().len()];
        self.server
            .stderr_tail
            .iter()
            .map(|line| {
                let line = redactor.redact_str(line, &mut counts).into_owned();
                let hits = find_credentials(&line);
                if redact && !hits.is_empty() {
                    redact_credentials(&line, &hits)
                } else {
                    line
                }
            })
            .collect()
    }
}

/// An error message with the server's last stderr lines after it.
pub(super) fn with_tail(mut msg: String, tail: &[String]) -> String {
    if !tail.is_empty() {
        msg.push_str("; its last stderr lines:\n");
        msg.push_str(&tail.join("\n"));
    }
    msg
}

/// `tail` within [`STDERR_TAIL_LINES`], [`STDERR_TAIL_LINE_BYTES`] and
/// [`STDERR_TAIL_BYTES`]: the newest lines kept, a longer line cut at a
/// character boundary. The reader keeps it so; the core checks again.
pub fn bounded_tail(mut tail: Vec<String>) -> Vec<String> {
    if tail.len() > STDERR_TAIL_LINES {
        tail.drain(..tail.len() - STDERR_TAIL_LINES);
    }
    let mut budget = STDERR_TAIL_BYTES;
    let mut kept = Vec::with_capacity(tail.len());
    for mut line in tail.into_iter().rev() {
        if budget == 0 {
            break;
        }
        let room = budget.min(STDERR_TAIL_LINE_BYTES);
        if line.len() > room {
            let mut cut = room;
            while !line.is_char_boundary(cut) {
                cut -= 1;
            }
            line.truncate(cut);
        }
        budget -= line.len();
        kept.push(line);
    }
    kept.reverse();
    kept
}
