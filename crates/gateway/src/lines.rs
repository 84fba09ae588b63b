//! Reading newline-delimited messages with a hard cap on line length: an
//! over-long line is discarded as it streams by, so memory does not grow
//! with it.

use std::io::{self, Read};

use crate::compact::Compactor;

/// Parses one line as a JSON value, exactly as `serde_json::from_slice`
/// does, except that an object with the same key twice is an error.
///
/// `serde_json` keeps the last of duplicate keys and drops the others
/// silently. A relay that screens the parsed value and then forwards the
/// original bytes when nothing changed would forward the dropped ones
/// unscreened: `{"result":{"content":[SECRET]},"result":{"content":["fine"]}}`
/// shows the secret to any reader that keeps the first (or logs the raw
/// line). Refusing such a line (as invalid JSON) closes that; JSON
/// (RFC 8259 section 4) says names SHOULD be unique, and no MCP message
/// needs duplicates. Costs the same as `from_slice` (one map insert per key,
/// which reports the duplicate).
///
/// The line's UTF-8 is checked once, whole, with SIMD (`simdutf8`), and
/// then parsed as a `str`, which `serde_json` does not check again: from a
/// slice it runs std's `from_utf8` over every string, a third of the parse
/// of a 64 MiB non-ASCII result. The same lines are accepted: a line that
/// `from_slice` accepts is valid UTF-8 (outside strings JSON is ASCII, and
/// strings are checked), and on valid UTF-8 both read the same text. A
/// line that is not valid UTF-8 goes through `from_slice`, for its error.
pub fn parse_json(line: &[u8]) -> Result<serde_json::Value, serde_json::Error> {
    use serde::de::DeserializeSeed;
    let Ok(text) = simdutf8::basic::from_utf8(line) else {
        let mut de = serde_json::Deserializer::from_slice(line);
        let v = Unique.deserialize(&mut de)?;
        de.end()?;
        return Ok(v);
    };
    let mut de = serde_json::Deserializer::from_str(text);
    let v = Unique.deserialize(&mut de)?;
    de.end()?;
    Ok(v)
}

/// A `serde_json::Value` built as serde_json builds it, refusing duplicate keys.
#[derive(Clone, Copy)]
struct Unique;

impl<'de> serde::de::DeserializeSeed<'de> for Unique {
    type Value = serde_json::Value;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Unique {
    type Value = serde_json::Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, b: bool) -> Result<Self::Value, E> {
        Ok(serde_json::Value::Bool(b))
    }

    fn visit_i64<E>(self, n: i64) -> Result<Self::Value, E> {
        Ok(serde_json::Value::Number(n.into()))
    }

    fn visit_u64<E>(self, n: u64) -> Result<Self::Value, E> {
        Ok(serde_json::Value::Number(n.into()))
    }

    fn visit_f64<E>(self, n: f64) -> Result<Self::Value, E> {
        Ok(serde_json::Number::from_f64(n)
            .map_or(serde_json::Value::Null, serde_json::Value::Number))
    }

    fn visit_str<E>(self, s: &str) -> Result<Self::Value, E> {
        Ok(serde_json::Value::String(s.to_owned()))
    }

    fn visit_string<E>(self, s: String) -> Result<Self::Value, E> {
        Ok(serde_json::Value::String(s))
    }

    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(serde_json::Value::Null)
    }

    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(serde_json::Value::Null)
    }

    fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
        while let Some(x) = seq.next_element_seed(self)? {
            out.push(x);
        }
        Ok(serde_json::Value::Array(out))
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut out = serde_json::Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let value = map.next_value_seed(self)?;
            if out.insert(key, value).is_some() {
                return Err(serde::de::Error::custom("duplicate object key"));
            }
        }
        Ok(serde_json::Value::Object(out))
    }
}

/// How much of an over-long line is kept (to find its JSON-RPC id).
pub const TOO_LONG_PREFIX: usize = 4096;

/// One item read from a stream.
#[derive(Debug)]
pub enum Line {
    /// A complete line without its newline.
    Data(Vec<u8>),
    /// A line longer than the cap whose long strings were cut while it
    /// streamed by (see [`crate::compact`]); only with
    /// [`LineReader::with_compaction`].
    Compacted {
        /// The compacted line.
        line: Vec<u8>,
        /// Length of the original line.
        len: usize,
    },
    /// A line longer than the cap, discarded; `prefix` holds its first bytes.
    TooLong {
        /// Length of the discarded line.
        len: usize,
        /// Its first [`TOO_LONG_PREFIX`] bytes.
        prefix: Vec<u8>,
    },
    /// End of stream.
    Eof,
}

/// Reads bounded lines from `R` in fixed-size chunks.
pub struct LineReader<R> {
    inner: R,
    chunk: Box<[u8]>,
    pos: usize,
    filled: usize,
    cur: Vec<u8>,
    max: usize,
    discarding: bool,
    discarded: usize,
    prefix: Vec<u8>,
    compact_keep: Option<usize>,
    compactor: Option<Compactor>,
}

/// One read's worth: the size of the server's stdout pipe (the sandbox
/// sets 1 MiB), so a long line is read in a sixteenth of the `read`s (and
/// writer wake-ups) that 64 KiB reads took. Allocated zeroed, so its pages
/// only become resident once a read fills them.
const CHUNK: usize = 1024 * 1024;

/// Buffers above this size are released after the line is handed out.
const SHRINK_ABOVE: usize = 1024 * 1024;

impl<R: Read> LineReader<R> {
    /// A reader refusing lines longer than `max` bytes.
    pub fn new(inner: R, max: usize) -> LineReader<R> {
        LineReader {
            inner,
            chunk: vec![0; CHUNK].into_boxed_slice(),
            pos: 0,
            filled: 0,
            cur: Vec::new(),
            max,
            discarding: false,
            discarded: 0,
            prefix: Vec::new(),
            compact_keep: None,
            compactor: None,
        }
    }

    /// A reader that, instead of refusing a line longer than `max`, cuts
    /// its string values to about `keep` bytes as it streams by. Lines
    /// whose compacted form is still over `max` are refused.
    pub fn with_compaction(inner: R, max: usize, keep: usize) -> LineReader<R> {
        let mut r = LineReader::new(inner, max);
        r.compact_keep = Some(keep);
        r
    }

    /// The stream read from.
    pub fn get_ref(&self) -> &R {
        &self.inner
    }

    /// The stream read from, mutably.
    pub fn get_mut(&mut self) -> &mut R {
        &mut self.inner
    }

    fn start_discard(&mut self, extra_from: usize, extra_to: usize) {
        self.discarding = true;
        self.prefix.clear();
        let take = TOO_LONG_PREFIX.min(self.cur.len());
        self.prefix.extend_from_slice(&self.cur[..take]);
        let extra = &self.chunk[extra_from..extra_to];
        let more = (TOO_LONG_PREFIX - self.prefix.len()).min(extra.len());
        self.prefix.extend_from_slice(&extra[..more]);
        self.discarded = self.cur.len() + extra.len();
        if let Some(keep) = self.compact_keep {
            let mut c = Compactor::new(keep, self.max);
            c.feed(&self.cur);
            c.feed(extra);
            self.compactor = Some(c);
        }
        self.cur = Vec::new();
    }

    fn keep_discarding(&mut self, from: usize, to: usize) {
        self.discarded += to - from;
        // the prefix fills up across reads too: with a cap below
        // TOO_LONG_PREFIX and short reads it would otherwise stop near the cap
        let more = (TOO_LONG_PREFIX - self.prefix.len()).min(to - from);
        self.prefix
            .extend_from_slice(&self.chunk[from..from + more]);
        if let Some(c) = self.compactor.as_mut() {
            c.feed(&self.chunk[from..to]);
        }
    }

    fn finish_discard(&mut self) -> Line {
        self.discarding = false;
        let len = self.discarded;
        self.discarded = 0;
        let prefix = std::mem::take(&mut self.prefix);
        match self.compactor.take().map(Compactor::finish) {
            Some(Some(line)) => Line::Compacted { line, len },
            _ => Line::TooLong { len, prefix },
        }
    }

    /// Reads the next line.
    pub fn next_line(&mut self) -> io::Result<Line> {
        loop {
            if self.pos < self.filled {
                let start = self.pos;
                match memchr::memchr(b'\n', &self.chunk[start..self.filled]) {
                    Some(i) => {
                        self.pos = start + i + 1;
                        if self.discarding {
                            self.keep_discarding(start, start + i);
                            return Ok(self.finish_discard());
                        }
                        if self.cur.len() + i > self.max {
                            self.start_discard(start, start + i);
                            return Ok(self.finish_discard());
                        }
                        let line = if self.cur.is_empty() {
                            self.chunk[start..start + i].to_vec()
                        } else {
                            self.cur.extend_from_slice(&self.chunk[start..start + i]);
                            let line = std::mem::take(&mut self.cur);
                            if line.capacity() > SHRINK_ABOVE {
                                self.cur = Vec::new();
                            }
                            line
                        };
                        return Ok(Line::Data(line));
                    }
                    None => {
                        let end = self.filled;
                        if self.discarding {
                            self.keep_discarding(start, end);
                        } else if self.cur.len() + (end - start) > self.max {
                            self.start_discard(start, end);
                        } else {
                            self.cur.extend_from_slice(&self.chunk[start..end]);
                        }
                        self.pos = end;
                    }
                }
            }
            let n = loop {
                match self.inner.read(&mut self.chunk) {
                    Ok(n) => break n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(e),
                }
            };
            if n == 0 {
                if self.discarding {
                    return Ok(self.finish_discard());
                }
                if !self.cur.is_empty() {
                    return Ok(Line::Data(std::mem::take(&mut self.cur)));
                }
                return Ok(Line::Eof);
            }
            self.pos = 0;
            self.filled = n;
        }
    }
}

/// Writes `line` and a newline straight to `w`, in one `writev` where the
/// stream takes it all (a blocking pipe does), for a line too long to
/// buffer. Written apart, std's stdout (a `LineWriter`) would scan the
/// whole line for a newline it does not hold: 6 ms for 64 MiB.
pub fn write_line(w: &mut dyn io::Write, line: &[u8]) -> io::Result<()> {
    let mut done = 0;
    while done <= line.len() {
        // by hand: `IoSlice::advance_slices` is newer than the workspace's
        // rust-version
        let bufs = [io::IoSlice::new(&line[done..]), io::IoSlice::new(b"\n")];
        match w.write_vectored(&bufs) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Trickle<'a>(&'a [u8], usize);
    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = self.1.min(self.0.len()).min(buf.len());
            buf[..n].copy_from_slice(&self.0[..n]);
            self.0 = &self.0[n..];
            Ok(n)
        }
    }

    /// A stream taking at most `max` bytes a write, failing every third
    /// with `Interrupted`.
    struct Narrow {
        out: Vec<u8>,
        max: usize,
        calls: usize,
    }
    impl io::Write for Narrow {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.calls += 1;
            if self.calls == 3 {
                self.calls = 0;
                return Err(io::ErrorKind::Interrupted.into());
            }
            let n = self.max.min(buf.len());
            self.out.extend_from_slice(&buf[..n]);
            Ok(n)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn long_line_is_written_whole_with_its_newline_across_short_writes() {
        let line: Vec<u8> = (0..1000u32).map(|i| b'a' + (i % 26) as u8).collect();
        for max in [1, 7, 999, 1000, 1001, 5000] {
            for len in [0, 1, 999, 1000] {
                let mut w = Narrow {
                    out: Vec::new(),
                    max,
                    calls: 0,
                };
                write_line(&mut w, &line[..len]).unwrap();
                assert_eq!(&w.out[..len], &line[..len], "max {max} len {len}");
                assert_eq!(&w.out[len..], b"\n", "max {max} len {len}");
            }
        }
        let mut v = Vec::new();
        write_line(&mut v, b"{}").unwrap();
        assert_eq!(v, b"{}\n");
    }

    fn collect(data: &[u8], step: usize, max: usize) -> Vec<String> {
        let mut r = LineReader::new(Trickle(data, step), max);
        let mut out = Vec::new();
        loop {
            match r.next_line().unwrap() {
                Line::Data(d) => out.push(String::from_utf8(d).unwrap()),
                Line::TooLong { len, .. } => out.push(format!("<too long {len}>")),
                Line::Compacted { line, len } => out.push(format!(
                    "<compacted {len}> {}",
                    String::from_utf8(line).unwrap()
                )),
                Line::Eof => return out,
            }
        }
    }

    #[test]
    fn duplicate_keys_are_refused_at_any_depth() {
        for line in [
            r#"{"a":1,"a":2}"#,
            r#"{"id":1,"result":{"content":[{"text":"SECRET"}]},"result":{"content":[]}}"#,
            r#"[{"x":{"k":"v","k":"v"}}]"#,
        ] {
            assert!(parse_json(line.as_bytes()).is_err(), "{line}");
            assert!(serde_json::from_slice::<serde_json::Value>(line.as_bytes()).is_ok());
        }
    }

    #[test]
    fn parse_json_equals_serde_json_otherwise() {
        for line in [
            r#"{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"h\u00e9\n\ud83d\ude00"}],"isError":false}}"#,
            r#"[1,-2,3.5,1e300,18446744073709551615,-9223372036854775808,true,null,"x",{},[]]"#,
            r#"  {"a" : { "b" : [ { "c" : "d" } ] } }  "#,
            r#""just a string""#,
            r#"{"k":"\u00e9","K":1}"#,
        ] {
            let want: serde_json::Value = serde_json::from_slice(line.as_bytes()).unwrap();
            assert_eq!(parse_json(line.as_bytes()).unwrap(), want, "{line}");
        }
        let bad: [&[u8]; 4] = [
            b"{\"a\":1} x",
            b"{\"a\":",
            b"\"\xff\"",
            b"{\"a\":\"\\u001\"}",
        ];
        for bad in bad {
            assert!(parse_json(bad).is_err(), "{bad:?}");
            assert!(serde_json::from_slice::<serde_json::Value>(bad).is_err());
        }
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        assert!(parse_json(deep.as_bytes()).is_err(), "recursion limit kept");
    }

    /// `parse_json` before it checked UTF-8 once up front: `from_slice`,
    /// which checks every string.
    fn parse_json_from_slice(line: &[u8]) -> Result<serde_json::Value, serde_json::Error> {
        use serde::de::DeserializeSeed;
        let mut de = serde_json::Deserializer::from_slice(line);
        let v = Unique.deserialize(&mut de)?;
        de.end()?;
        Ok(v)
    }

    /// Generated lines: JSON trees whose strings and keys are built from
    /// escapes (`\u0073`, surrogate pairs, lone surrogates), non-ASCII,
    /// broken UTF-8 (a cut sequence, an encoded surrogate, 0xff) and a
    /// secret split by escapes, with duplicate keys now and then; then each
    /// line cut and with bytes flipped. The parse of the whole-line UTF-8
    /// check must equal the one of `from_slice`, value for value and
    /// refusal for refusal; the screening reads only the value, so it sees
    /// the same strings.
    #[test]
    fn parse_json_equals_from_slice_on_generated_lines() {
        const PIECES: [&[u8]; 16] = [
            b"plain",
            b"s3cr\\u0065t-value",
            b"\\u0073ecret",
            "é".as_bytes(),
            "😀 ünï".as_bytes(),
            b"\\ud83d\\ude00",
            b"\\ud800",
            b"\\n\\t\\\"\\\\\\/",
            b"\xff",
            b"\xc3",
            b"\xed\xa0\x80",
            b"\xf4\x90\x80\x80",
            b"\\u00",
            b"\x01",
            b"secret-value",
            b"\\u0000",
        ];
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut rnd = move |n: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as usize
        };
        fn string(out: &mut Vec<u8>, rnd: &mut dyn FnMut(usize) -> usize) {
            out.push(b'"');
            for _ in 0..rnd(4) {
                out.extend_from_slice(PIECES[rnd(PIECES.len())]);
            }
            out.push(b'"');
        }
        fn value(out: &mut Vec<u8>, depth: usize, rnd: &mut dyn FnMut(usize) -> usize) {
            match if depth > 3 { rnd(3) } else { rnd(6) } {
                0 => string(out, rnd),
                1 => out.extend_from_slice([&b"1"[..], b"-2.5e3", b"true", b"null"][rnd(4)]),
                2 => out.extend_from_slice(b"18446744073709551616"),
                3 | 4 => {
                    out.push(b'{');
                    let mut keys: Vec<Vec<u8>> = Vec::new();
                    for i in 0..rnd(4) {
                        if i > 0 {
                            out.push(b',');
                        }
                        let key = match keys.first() {
                            Some(k) if rnd(4) == 0 => k.clone(),
                            _ => {
                                let mut k = Vec::new();
                                string(&mut k, rnd);
                                k
                            }
                        };
                        out.extend_from_slice(&key);
                        keys.push(key);
                        out.push(b':');
                        value(out, depth + 1, rnd);
                    }
                    out.push(b'}');
                }
                _ => {
                    out.push(b'[');
                    for i in 0..rnd(4) {
                        if i > 0 {
                            out.push(b',');
                        }
                        value(out, depth + 1, rnd);
                    }
                    out.push(b']');
                }
            }
        }
        let (mut ok, mut refused) = (0, 0);
        for _ in 0..20_000 {
            let mut line = Vec::new();
            value(&mut line, 0, &mut rnd);
            let mut variants = vec![line.clone()];
            if !line.is_empty() {
                variants.push(line[..rnd(line.len())].to_vec());
                let mut flipped = line.clone();
                let at = rnd(flipped.len());
                flipped[at] = [b'"', b'\\', 0x80, b'}', b' '][rnd(5)];
                variants.push(flipped);
            }
            for v in variants {
                let (new, old) = (parse_json(&v), parse_json_from_slice(&v));
                match (&new, &old) {
                    (Ok(a), Ok(b)) => {
                        assert_eq!(a, b, "{}", String::from_utf8_lossy(&v));
                        ok += 1;
                    }
                    (Err(_), Err(_)) => refused += 1,
                    _ => panic!("{}: {new:?} vs {old:?}", String::from_utf8_lossy(&v)),
                }
            }
        }
        // both kinds were exercised
        assert!(
            ok > 1000 && refused > 1000,
            "{ok} parsed, {refused} refused"
        );
    }

    #[test]
    fn lines_split_across_reads_are_joined() {
        for step in [1, 3, 7, 100] {
            assert_eq!(
                collect(b"ab\ncdef\n\ngh", step, 10),
                vec!["ab", "cdef", "", "gh"]
            );
        }
    }

    #[test]
    fn over_long_json_line_is_compacted_while_streaming() {
        let long = format!("{{\"a\":\"{}\"}}\nok\n", "x".repeat(100));
        for step in [1, 5, 1000] {
            let mut r = LineReader::with_compaction(Trickle(long.as_bytes(), step), 50, 10);
            match r.next_line().unwrap() {
                Line::Compacted { line, len } => {
                    assert_eq!(len, 108);
                    let v: serde_json::Value = serde_json::from_slice(&line).unwrap();
                    assert!(v["a"]
                        .as_str()
                        .unwrap()
                        .starts_with("xxxxxxxxxx\n[mcpbox: truncated 90 bytes]"));
                }
                other => panic!("{other:?}"),
            }
            assert!(matches!(r.next_line().unwrap(), Line::Data(d) if d == b"ok"));
        }
    }

    #[test]
    fn over_long_line_is_discarded_and_next_line_survives() {
        for step in [1, 5, 1000] {
            assert_eq!(
                collect(b"0123456789abc\nok\n", step, 8),
                vec!["<too long 13>", "ok"]
            );
        }
        assert_eq!(collect(b"12345678\n", 4, 8), vec!["12345678"]);
    }

    /// Found by the `lines` fuzz target: with a cap below TOO_LONG_PREFIX
    /// and short reads, the prefix of an over-long line stopped at the read
    /// that crossed the cap, so an id later in the line was lost.
    #[test]
    fn too_long_prefix_keeps_first_bytes_across_reads() {
        for step in [1, 3, 1000] {
            let mut r = LineReader::new(Trickle(b"0123456789abc\nok\n", step), 8);
            match r.next_line().unwrap() {
                Line::TooLong { len, prefix } => {
                    assert_eq!(len, 13);
                    assert_eq!(prefix, b"0123456789abc");
                }
                other => panic!("{other:?}"),
            }
        }
    }
}
