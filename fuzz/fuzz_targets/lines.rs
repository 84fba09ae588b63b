//! The line framing every byte from the host and the server goes through:
//! `mcpbox_gateway::lines::LineReader`, fed arbitrary bytes in arbitrary
//! chunk sizes (with `Interrupted` errors mixed in), with and without
//! compaction.
//!
//! Input layout (all derived from the fuzzer's bytes, so every input is
//! valid and a crash reproduces from its artifact alone):
//!
//! ```text
//! [0..2]   max_line, u16 little-endian, masked to 0..=8191
//! [2]      bit 0: compaction on; the other bits are ignored
//! [3]      compaction `keep`
//! [4..12]  chunk sizes, cycled: n means a read of at most n*n+1 bytes,
//!          0 means one `ErrorKind::Interrupted` first
//! [12..]   the stream
//! ```
//!
//! Invariants checked against the stream itself:
//! - each item accounts for exactly one line of the stream, in order, and
//!   `Eof` comes only once all of it is consumed (and stays `Eof`);
//! - `Data` is that line, byte for byte, at most `max_line` long, so the
//!   `Data` lines joined with newlines reproduce the stream when no line is
//!   too long;
//! - `TooLong` and `Compacted` come only for lines over `max_line`, carry
//!   their true length; `TooLong`'s prefix is the line's first bytes;
//!   a compacted line is itself within `max_line` and has no newline;
//! - nothing panics.
#![no_main]

use std::io::{self, Read};

use libfuzzer_sys::fuzz_target;
use mcpbox_gateway::lines::{Line, LineReader, TOO_LONG_PREFIX};

/// Hands out `data` in the chunk sizes the input chose.
struct Chunked<'a> {
    data: &'a [u8],
    sizes: &'a [u8],
    turn: usize,
    interrupted: bool,
}

impl Read for Chunked<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let s = self.sizes.get(self.turn % self.sizes.len().max(1)).copied();
        if s == Some(0) && !self.interrupted {
            self.interrupted = true;
            return Err(io::ErrorKind::Interrupted.into());
        }
        self.interrupted = false;
        self.turn += 1;
        let want = s.map_or(usize::MAX, |s| usize::from(s) * usize::from(s) + 1);
        let n = want.min(self.data.len()).min(buf.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

fuzz_target!(|input: &[u8]| {
    if input.len() < 12 {
        return;
    }
    let max = usize::from(u16::from_le_bytes([input[0], input[1]]) & 0x1fff);
    let compaction = input[2] & 1 == 1;
    let keep = usize::from(input[3]);
    let sizes = &input[4..12];
    let stream = &input[12..];
    let source = Chunked {
        data: stream,
        sizes,
        turn: 0,
        interrupted: false,
    };
    let mut reader = if compaction {
        LineReader::with_compaction(source, max, keep)
    } else {
        LineReader::new(source, max)
    };

    let mut at = 0; // where the next line starts in `stream`
    let mut data_lines: Vec<Vec<u8>> = Vec::new();
    let mut any_too_long = false;
    loop {
        let item = match reader.next_line() {
            Ok(item) => item,
            // The reader above never fails (it only interrupts, which
            // LineReader retries), so an error is the framing's own.
            Err(e) => panic!("next_line failed on an infallible reader: {e}"),
        };
        if let Line::Eof = item {
            assert_eq!(at, stream.len(), "Eof before the stream was consumed");
            // and it stays at the end
            assert!(matches!(reader.next_line(), Ok(Line::Eof)));
            break;
        }
        assert!(at < stream.len(), "a line after the stream was consumed");
        let rest = &stream[at..];
        let line_len = rest.iter().position(|&b| b == b'\n').unwrap_or(rest.len());
        let line = &rest[..line_len];
        match item {
            Line::Data(d) => {
                assert_eq!(d, line, "Data is not the line at offset {at}");
                assert!(d.len() <= max, "Data of {} bytes over max {max}", d.len());
                data_lines.push(d);
            }
            Line::TooLong { len, prefix } => {
                any_too_long = true;
                assert_eq!(len, line_len, "TooLong.len at offset {at}");
                assert!(len > max, "TooLong for a line of {len} within max {max}");
                assert_eq!(prefix, &line[..line_len.min(TOO_LONG_PREFIX)]);
            }
            Line::Compacted { line: c, len } => {
                any_too_long = true;
                assert!(compaction, "Compacted without compaction");
                assert_eq!(len, line_len, "Compacted.len at offset {at}");
                assert!(len > max, "Compacted a line of {len} within max {max}");
                assert!(
                    c.len() <= max,
                    "compacted line of {} over max {max}",
                    c.len()
                );
                assert!(!c.contains(&b'\n'), "compacted line holds a newline");
            }
            Line::Eof => unreachable!(),
        }
        at += line_len;
        if at < stream.len() {
            at += 1; // the newline
        }
    }
    if !any_too_long {
        let mut joined = data_lines.join(&b'\n');
        if stream.last() == Some(&b'\n') {
            joined.push(b'\n');
        }
        assert_eq!(joined, stream, "Data lines do not reproduce the stream");
    }
});
