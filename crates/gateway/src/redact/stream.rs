//! Redaction of a byte stream (the server's stderr), line by line.

use super::Redactor;

/// Redacts secrets from a stream of bytes, line by line, with a carry-over
/// window for lines longer than the buffer.
#[derive(Debug)]
pub struct StreamRedactor {
    redactor: Redactor,
    buf: Vec<u8>,
    max_buf: usize,
    /// Per-secret match counts so far.
    pub counts: Vec<usize>,
}

impl StreamRedactor {
    /// A stream redactor that emits a partial line once `max_buf` bytes
    /// are buffered without a newline.
    pub fn new(redactor: Redactor, max_buf: usize) -> StreamRedactor {
        let n = redactor.names().len();
        StreamRedactor {
            redactor,
            buf: Vec::new(),
            max_buf: max_buf.max(64),
            counts: vec![0; n],
        }
    }

    /// Feeds bytes; calls `emit` with each redacted chunk (a whole line
    /// without its newline, or a part of an over-long line).
    pub fn push(&mut self, data: &[u8], mut emit: impl FnMut(&[u8])) {
        self.buf.extend_from_slice(data);
        // lines are taken from `start` on and drained once at the end
        let mut start = 0;
        while let Some(nl) = memchr::memchr(b'\n', &self.buf[start..]) {
            let line = self
                .redactor
                .redact_bytes(&self.buf[start..start + nl], &mut self.counts);
            emit(&line);
            start += nl + 1;
        }
        let rest = &self.buf[start..];
        if rest.len() >= self.max_buf + self.redactor.max_len() {
            let cut = self.redactor.safe_prefix(rest);
            if cut > 0 {
                let part = self.redactor.redact_bytes(&rest[..cut], &mut self.counts);
                emit(&part);
                start += cut;
            }
        }
        self.buf.drain(..start);
    }

    /// Flushes what is left at end of stream.
    pub fn finish(&mut self, mut emit: impl FnMut(&[u8])) {
        if !self.buf.is_empty() {
            let rest = self.redactor.redact_bytes(&self.buf, &mut self.counts);
            emit(&rest);
            self.buf.clear();
        }
    }
}
