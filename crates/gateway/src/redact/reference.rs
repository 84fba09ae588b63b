//! The redactor and credential finder as they were before the multi-pattern
//! rewrite: one `memmem` pass per pattern. Kept verbatim (test-only) as the
//! reference the fast implementation must equal, result for result.
#![allow(clippy::all)]

use super::shapes::{alnum_us, SHAPES};
use super::{base64, base64_core, url_encode, B64_STD, B64_URL, MIN_DERIVED_LEN};
use std::borrow::Cow;

/// One pattern: bytes to find and the index of the secret it belongs to.
#[derive(Debug, Clone)]
struct Pattern {
    bytes: Vec<u8>,
    finder: memchr::memmem::Finder<'static>,
    secret: usize,
}

/// Finds and replaces secret values in every encoding mcpbox knows.
#[derive(Debug, Clone, Default)]
pub struct Redactor {
    names: Vec<String>,
    replacements: Vec<String>,
    /// Sorted longest first so the widest match wins at a position.
    patterns: Vec<Pattern>,
    max_len: usize,
}

impl Redactor {
    /// Builds a redactor for `(name, value)` pairs. Empty values are ignored.
    pub fn new<'a>(secrets: impl IntoIterator<Item = (&'a str, &'a [u8])>) -> Redactor {
        let mut r = Redactor::default();
        for (name, value) in secrets {
            if value.is_empty() {
                continue;
            }
            let idx = r.names.len();
            r.names.push(name.to_string());
            r.replacements.push(format!("[REDACTED:{name}]"));
            let mut forms: Vec<Vec<u8>> = vec![value.to_vec()];
            let mut derived: Vec<String> = vec![
                mcpbox_policy::hex::encode(value),
                mcpbox_policy::hex::encode(value).to_ascii_uppercase(),
                url_encode(value, true),
                url_encode(value, false),
            ];
            // '+' for space is the form-encoding variant
            derived.push(url_encode(value, true).replace("%20", "+"));
            for alphabet in [B64_STD, B64_URL] {
                derived.push(base64(value, alphabet, true));
                derived.push(base64(value, alphabet, false));
                for shift in 0..3 {
                    derived.push(base64_core(value, shift, alphabet));
                }
            }
            for d in derived {
                if d.len() >= MIN_DERIVED_LEN {
                    forms.push(d.into_bytes());
                }
            }
            forms.sort();
            forms.dedup();
            for bytes in forms {
                r.max_len = r.max_len.max(bytes.len());
                let finder = memchr::memmem::Finder::new(&bytes).into_owned();
                r.patterns.push(Pattern {
                    bytes,
                    finder,
                    secret: idx,
                });
            }
        }
        r.patterns.sort_by_key(|p| std::cmp::Reverse(p.bytes.len()));
        r
    }

    /// True when there is nothing to redact.
    pub fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }

    /// Length of the longest pattern; a streaming window must keep
    /// `max_len - 1` bytes of carry-over.
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// Secret names, by index.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Finds the merged match ranges in `hay`: (start, end, secret index).
    pub fn find(&self, hay: &[u8]) -> Vec<(usize, usize, usize)> {
        let mut hits: Vec<(usize, usize, usize)> = Vec::new();
        for p in &self.patterns {
            if p.bytes.len() > hay.len() {
                continue;
            }
            let mut i = 0;
            while let Some(off) = p.finder.find(&hay[i..]) {
                let at = i + off;
                hits.push((at, at + p.bytes.len(), p.secret));
                i = at + p.bytes.len();
            }
        }
        if hits.len() <= 1 {
            return hits;
        }
        hits.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
        let mut merged: Vec<(usize, usize, usize)> = Vec::with_capacity(hits.len());
        for h in hits {
            match merged.last_mut() {
                Some(last) if h.0 < last.1 => last.1 = last.1.max(h.1),
                _ => merged.push(h),
            }
        }
        merged
    }

    /// Redacts `s`; returns the new text and per-secret counts when
    /// anything matched. Replacement boundaries are widened to char
    /// boundaries so the result stays valid UTF-8.
    pub fn redact_str<'a>(&self, s: &'a str, counts: &mut [usize]) -> Cow<'a, str> {
        if self.patterns.is_empty() || s.len() < self.min_len() {
            return Cow::Borrowed(s);
        }
        let hits = self.find(s.as_bytes());
        if hits.is_empty() {
            return Cow::Borrowed(s);
        }
        let mut out = String::with_capacity(s.len());
        let mut pos = 0;
        for (mut start, mut end, secret) in hits {
            while !s.is_char_boundary(start) {
                start -= 1;
            }
            while !s.is_char_boundary(end) {
                end += 1;
            }
            if start < pos {
                start = pos;
            }
            out.push_str(&s[pos..start]);
            out.push_str(&self.replacements[secret]);
            if let Some(c) = counts.get_mut(secret) {
                *c += 1;
            }
            pos = end.max(pos);
        }
        out.push_str(&s[pos..]);
        Cow::Owned(out)
    }

    fn min_len(&self) -> usize {
        self.patterns.last().map_or(usize::MAX, |p| p.bytes.len())
    }

    /// The replacement text for secret `index`.
    pub fn replacement(&self, index: usize) -> &str {
        self.replacements
            .get(index)
            .map_or("[REDACTED]", String::as_str)
    }

    /// Redacts a value split across adjacent strings (e.g. two text content
    /// items): matches in the concatenation that span more than one piece
    /// are cut out of each piece, the label going into the first. Returns
    /// whether anything changed.
    pub fn redact_across(&self, pieces: &mut [&mut String], counts: &mut [usize]) -> bool {
        if self.patterns.is_empty() || pieces.len() < 2 {
            return false;
        }
        let mut concat = String::new();
        let mut offsets = Vec::with_capacity(pieces.len());
        for p in pieces.iter() {
            offsets.push(concat.len());
            concat.push_str(p);
        }
        let mut edits: Vec<Vec<(usize, usize, bool, usize)>> = vec![Vec::new(); pieces.len()];
        let mut changed = false;
        for (start, end, secret) in self.find(concat.as_bytes()) {
            let first = offsets.iter().rposition(|&o| o <= start).unwrap_or(0);
            let last = offsets.iter().rposition(|&o| o < end).unwrap_or(0);
            if first == last {
                continue; // inside one piece: already handled per string
            }
            if let Some(c) = counts.get_mut(secret) {
                *c += 1;
            }
            for (i, edit) in edits.iter_mut().enumerate().take(last + 1).skip(first) {
                let off = offsets[i];
                let len = pieces[i].len();
                let s = start.max(off) - off;
                let e = end.min(off + len) - off;
                edit.push((s, e, i == first, secret));
            }
            changed = true;
        }
        for (piece, mut list) in pieces.iter_mut().zip(edits) {
            list.sort_by_key(|e| std::cmp::Reverse(e.0));
            for (mut s, mut e, label, secret) in list {
                while !piece.is_char_boundary(s) {
                    s -= 1;
                }
                while e < piece.len() && !piece.is_char_boundary(e) {
                    e += 1;
                }
                let with = if label {
                    self.replacement(secret).to_string()
                } else {
                    String::new()
                };
                piece.replace_range(s..e, &with);
            }
        }
        changed
    }

    /// For a string that was cut short: if it ends with the first bytes
    /// (3 or more) of any pattern, replaces that tail with the secret's
    /// label, so a cut cannot leave part of a secret behind.
    pub fn strip_partial_tail(&self, s: &str, counts: &mut [usize]) -> Option<String> {
        let b = s.as_bytes();
        let mut best: Option<(usize, usize)> = None;
        for p in &self.patterns {
            let max = (p.bytes.len() - 1).min(b.len());
            for k in (3..=max).rev() {
                if b.ends_with(&p.bytes[..k]) {
                    if best.is_none_or(|(bk, _)| k > bk) {
                        best = Some((k, p.secret));
                    }
                    break;
                }
            }
        }
        let (k, secret) = best?;
        let mut cut = b.len() - k;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        if let Some(c) = counts.get_mut(secret) {
            *c += 1;
        }
        Some(format!("{}{}", &s[..cut], self.replacement(secret)))
    }

    /// Redacts bytes (stderr). Returns the redacted bytes.
    pub fn redact_bytes(&self, b: &[u8], counts: &mut [usize]) -> Vec<u8> {
        let hits = self.find(b);
        let mut out = Vec::with_capacity(b.len());
        let mut pos = 0;
        for (start, end, secret) in hits {
            let start = start.max(pos);
            out.extend_from_slice(&b[pos..start]);
            out.extend_from_slice(self.replacements[secret].as_bytes());
            if let Some(c) = counts.get_mut(secret) {
                *c += 1;
            }
            pos = end.max(pos);
        }
        out.extend_from_slice(&b[pos..]);
        out
    }

    /// Splits a streaming buffer: returns how many leading bytes can be
    /// emitted now, keeping a carry-over so that a value split across reads
    /// is still caught, and never cutting a match in two.
    pub fn safe_prefix(&self, b: &[u8]) -> usize {
        let keep = self.max_len.saturating_sub(1);
        let mut cut = b.len().saturating_sub(keep);
        for (start, end, _) in self.find(b) {
            if start < cut && end > cut {
                cut = end;
            }
        }
        cut
    }
}

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
        loop {
            if let Some(nl) = memchr::memchr(b'\n', &self.buf) {
                let line = self
                    .redactor
                    .redact_bytes(&self.buf[..nl], &mut self.counts);
                emit(&line);
                self.buf.drain(..=nl);
                continue;
            }
            if self.buf.len() >= self.max_buf + self.redactor.max_len() {
                let cut = self.redactor.safe_prefix(&self.buf);
                if cut == 0 {
                    break;
                }
                let part = self
                    .redactor
                    .redact_bytes(&self.buf[..cut], &mut self.counts);
                emit(&part);
                self.buf.drain(..cut);
            }
            break;
        }
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

const PEM_BEGIN: &str = "-----BEGIN ";
const PEM_KEY: &str = "PRIVATE KEY-----";

/// The credential shapes found in `s`, as (start, end, rule).
pub fn find_credentials(s: &str) -> Vec<(usize, usize, &'static str)> {
    let b = s.as_bytes();
    let mut hits = Vec::new();
    // PEM private key blocks: from BEGIN to the matching END line, or to
    // the end of the text when it was cut.
    let mut from = 0;
    while let Some(off) = s[from..].find(PEM_BEGIN) {
        let start = from + off;
        let header_end = s[start..].find('\n').map_or(s.len(), |n| start + n);
        if s[start..header_end].contains(PEM_KEY) {
            let end = match s[header_end..].find("-----END ") {
                Some(e) => {
                    let e = header_end + e;
                    match s[e..].find(PEM_KEY) {
                        Some(k) => e + k + PEM_KEY.len(),
                        None => s.len(),
                    }
                }
                None => s.len(),
            };
            hits.push((start, end, "credential.private_key"));
            from = end;
        } else {
            from = start + PEM_BEGIN.len();
        }
    }
    let mut i = 0;
    while i < b.len() {
        let at_boundary = i == 0 || !alnum_us(b[i - 1]);
        if at_boundary && b[i].is_ascii_alphabetic() {
            let mut matched = None;
            for shape in SHAPES {
                if b[i..].starts_with(shape.prefix.as_bytes()) {
                    let body = i + shape.prefix.len();
                    let mut j = body;
                    while j < b.len() && (shape.charset)(b[j]) && j - body < shape.max {
                        j += 1;
                    }
                    let n = j - body;
                    let ends_clean = j == b.len() || !alnum_us(b[j]) || shape.max > n;
                    if n >= shape.min && ends_clean {
                        matched = Some((i, j, shape.rule.as_str()));
                        break;
                    }
                }
            }
            if let Some(m) = matched {
                if !hits
                    .iter()
                    .any(|h: &(usize, usize, &str)| m.0 < h.1 && h.0 < m.1)
                {
                    hits.push(m);
                }
                i = m.1;
                continue;
            }
        }
        i += 1;
    }
    hits.sort_by_key(|h| h.0);
    hits
}
