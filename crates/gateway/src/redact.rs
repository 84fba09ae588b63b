//! Redaction of secret values (and their encodings) and detection of
//! credential-shaped strings.
//!
//! Matching works on decoded text (JSON string values after parsing, or raw
//! stderr bytes), so escaped forms such as `\u0041` in the JSON wire format
//! cannot slip past.

use std::borrow::Cow;

use mcpbox_policy::Reason;

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

/// Encodings shorter than this are not used as patterns (the plain value
/// always is): a 3-character base64 core would redact half of all text.
const MIN_DERIVED_LEN: usize = 6;

const B64_STD: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
const B64_URL: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/// Base64 of `data` with `alphabet`, padded with `=` when `pad`.
pub fn base64(data: &[u8], alphabet: &[u8; 64], pad: bool) -> String {
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        let chars = chunk.len() + 1;
        for i in 0..4 {
            if i < chars {
                out.push(alphabet[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else if pad {
                out.push('=');
            }
        }
    }
    out
}

/// The base64 characters that depend only on `value` when it sits at byte
/// offset `shift` (0, 1 or 2) inside a longer base64-encoded stream.
fn base64_core(value: &[u8], shift: usize, alphabet: &[u8; 64]) -> String {
    let mut buf = vec![0u8; shift];
    buf.extend_from_slice(value);
    let encoded = base64(&buf, alphabet, false);
    let first = (8 * shift).div_ceil(6);
    let last = (8 * (shift + value.len())) / 6; // exclusive
    if last <= first {
        return String::new();
    }
    encoded.get(first..last).unwrap_or_default().to_string()
}

fn url_encode(value: &[u8], upper: bool) -> String {
    let hex: &[u8; 16] = if upper {
        b"0123456789ABCDEF"
    } else {
        b"0123456789abcdef"
    };
    let mut out = String::with_capacity(value.len());
    for &b in value {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push('%');
            out.push(hex[usize::from(b >> 4)] as char);
            out.push(hex[usize::from(b & 15)] as char);
        }
    }
    out
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
                crate::digest::hex_lower(value),
                crate::digest::hex_lower(value).to_ascii_uppercase(),
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

/// A credential shape: a fixed prefix followed by a run of allowed
/// characters of a minimum (and optional maximum) length.
struct Shape {
    /// Reason code for the audit log.
    rule: Reason,
    prefix: &'static str,
    charset: fn(u8) -> bool,
    min: usize,
    max: usize,
}

fn alnum(b: u8) -> bool {
    b.is_ascii_alphanumeric()
}
fn alnum_us(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}
fn alnum_us_dash(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'-'
}
fn upper_digit(b: u8) -> bool {
    b.is_ascii_uppercase() || b.is_ascii_digit()
}
fn alnum_dash(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'-'
}

/// Well-known token shapes, longest prefix first where prefixes overlap.
const SHAPES: &[Shape] = &[
    // GitHub fine-grained personal access token
    Shape {
        rule: Reason::CredentialGithubPat,
        prefix: "github_pat_",
        charset: alnum_us,
        min: 22,
        max: 255,
    },
    // GitHub classic tokens: personal, OAuth, user-to-server, server-to-server, refresh
    Shape {
        rule: Reason::CredentialGithub,
        prefix: "ghp_",
        charset: alnum,
        min: 30,
        max: 255,
    },
    Shape {
        rule: Reason::CredentialGithub,
        prefix: "gho_",
        charset: alnum,
        min: 30,
        max: 255,
    },
    Shape {
        rule: Reason::CredentialGithub,
        prefix: "ghu_",
        charset: alnum,
        min: 30,
        max: 255,
    },
    Shape {
        rule: Reason::CredentialGithub,
        prefix: "ghs_",
        charset: alnum,
        min: 30,
        max: 255,
    },
    Shape {
        rule: Reason::CredentialGithub,
        prefix: "ghr_",
        charset: alnum,
        min: 30,
        max: 255,
    },
    // Anthropic API key (before the generic sk-)
    Shape {
        rule: Reason::CredentialAnthropic,
        prefix: "sk-ant-",
        charset: alnum_us_dash,
        min: 20,
        max: 255,
    },
    // OpenAI-style secret key
    Shape {
        rule: Reason::CredentialOpenai,
        prefix: "sk-",
        charset: alnum_us_dash,
        min: 20,
        max: 255,
    },
    // Stripe live secret / restricted keys
    Shape {
        rule: Reason::CredentialStripe,
        prefix: "sk_live_",
        charset: alnum,
        min: 16,
        max: 255,
    },
    Shape {
        rule: Reason::CredentialStripe,
        prefix: "rk_live_",
        charset: alnum,
        min: 16,
        max: 255,
    },
    // Slack bot / user / app tokens
    Shape {
        rule: Reason::CredentialSlack,
        prefix: "xoxb-",
        charset: alnum_dash,
        min: 10,
        max: 255,
    },
    Shape {
        rule: Reason::CredentialSlack,
        prefix: "xoxp-",
        charset: alnum_dash,
        min: 10,
        max: 255,
    },
    Shape {
        rule: Reason::CredentialSlack,
        prefix: "xoxa-",
        charset: alnum_dash,
        min: 10,
        max: 255,
    },
    Shape {
        rule: Reason::CredentialSlack,
        prefix: "xapp-",
        charset: alnum_dash,
        min: 10,
        max: 255,
    },
    // AWS access key ids (long-term and temporary)
    Shape {
        rule: Reason::CredentialAwsAccessKey,
        prefix: "AKIA",
        charset: upper_digit,
        min: 16,
        max: 16,
    },
    Shape {
        rule: Reason::CredentialAwsAccessKey,
        prefix: "ASIA",
        charset: upper_digit,
        min: 16,
        max: 16,
    },
    // Google API key
    Shape {
        rule: Reason::CredentialGoogleApiKey,
        prefix: "AIza",
        charset: alnum_us_dash,
        min: 35,
        max: 35,
    },
    // GitLab personal access token
    Shape {
        rule: Reason::CredentialGitlab,
        prefix: "glpat-",
        charset: alnum_us_dash,
        min: 20,
        max: 255,
    },
    // npm access token
    Shape {
        rule: Reason::CredentialNpm,
        prefix: "npm_",
        charset: alnum,
        min: 36,
        max: 36,
    },
];

const PEM_BEGIN: &str = "-----BEGIN ";
const PEM_KEY: &str = "PRIVATE KEY-----";

/// The credential shapes found in `s`, as (start, end, rule).
pub fn find_credentials(s: &str) -> Vec<(usize, usize, Reason)> {
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
            hits.push((start, end, Reason::CredentialPrivateKey));
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
                        matched = Some((i, j, shape.rule));
                        break;
                    }
                }
            }
            if let Some(m) = matched {
                if !hits
                    .iter()
                    .any(|h: &(usize, usize, Reason)| m.0 < h.1 && h.0 < m.1)
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

/// Replaces credential shapes in `s` with `[REDACTED:credential]`.
pub fn redact_credentials(s: &str, hits: &[(usize, usize, Reason)]) -> String {
    let mut out = String::with_capacity(s.len());
    let mut pos = 0;
    for &(start, end, _) in hits {
        if start < pos {
            continue;
        }
        out.push_str(&s[pos..start]);
        out.push_str("[REDACTED:credential]");
        pos = end;
    }
    out.push_str(&s[pos..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r() -> Redactor {
        Redactor::new([("TOKEN", "s3cr3t-VALUE/with+chars".as_bytes())])
    }

    #[test]
    fn base64_matches_known_vectors() {
        assert_eq!(base64(b"foobar", B64_STD, true), "Zm9vYmFy");
        assert_eq!(base64(b"fo", B64_STD, true), "Zm8=");
        assert_eq!(base64(b"f", B64_STD, false), "Zg");
        assert_eq!(base64(&[0xfb, 0xff], B64_URL, false), "-_8");
    }

    #[test]
    fn every_encoding_is_redacted() {
        let v = b"s3cr3t-VALUE/with+chars";
        let red = r();
        let encodings = [
            String::from_utf8(v.to_vec()).unwrap(),
            base64(v, B64_STD, true),
            base64(v, B64_URL, false),
            url_encode(v, true),
            url_encode(v, false),
            crate::digest::hex_lower(v),
            crate::digest::hex_lower(v).to_uppercase(),
        ];
        for e in encodings {
            let text = format!("before {e} after");
            let mut counts = vec![0];
            let out = red.redact_str(&text, &mut counts);
            assert!(!out.contains(&e), "{e} survived: {out}");
            assert!(out.contains("[REDACTED:TOKEN]"));
        }
    }

    #[test]
    fn value_inside_longer_base64_stream_is_caught_at_every_alignment() {
        let v = b"s3cr3t-VALUE/with+chars";
        let red = r();
        for prefix in ["", "x", "xy", "xyz"] {
            let mut data = prefix.as_bytes().to_vec();
            data.extend_from_slice(v);
            data.extend_from_slice(b" and more text");
            let enc = base64(&data, B64_STD, true);
            let out = red.redact_str(&enc, &mut [0]);
            assert!(out.contains("[REDACTED:TOKEN]"), "prefix {prefix:?}: {out}");
        }
    }

    #[test]
    fn value_split_across_pieces_is_caught() {
        let red = r();
        let mut a = "first s3cr3t-VAL".to_string();
        let mut b = "UE/with+chars second".to_string();
        let mut counts = vec![0];
        assert!(red.redact_across(&mut [&mut a, &mut b], &mut counts));
        assert_eq!(a, "first [REDACTED:TOKEN]");
        assert_eq!(b, " second");
        assert_eq!(counts, vec![1]);
    }

    #[test]
    fn cut_secret_prefix_is_removed() {
        let red = r();
        let out = red
            .strip_partial_tail("result: s3cr3t-VA", &mut [0])
            .unwrap();
        assert_eq!(out, "result: [REDACTED:TOKEN]");
        assert!(red.strip_partial_tail("result: fine", &mut [0]).is_none());
    }

    #[test]
    fn stream_split_value_is_caught() {
        let red = r();
        let mut s = StreamRedactor::new(red, 64);
        let mut lines = Vec::new();
        s.push(b"leak: s3cr3t-VA", |l| {
            lines.push(String::from_utf8_lossy(l).into_owned())
        });
        s.push(b"LUE/with+chars done\n", |l| {
            lines.push(String::from_utf8_lossy(l).into_owned())
        });
        assert_eq!(lines, vec!["leak: [REDACTED:TOKEN] done"]);
    }

    #[test]
    fn stream_long_line_without_newline_keeps_carry_over() {
        let red = r();
        let mut s = StreamRedactor::new(red, 64);
        let mut out = Vec::new();
        let filler = "a".repeat(100);
        s.push(filler.as_bytes(), |l| out.extend_from_slice(l));
        s.push(b"s3cr3t-VALUE/wi", |l| out.extend_from_slice(l));
        s.push(&[b'x'; 10], |l| out.extend_from_slice(l));
        s.push(b"th+chars", |l| out.extend_from_slice(l));
        // a split value with junk in between is not the value
        s.push(b" s3cr3t-VALUE/with+chars", |l| out.extend_from_slice(l));
        s.push(&[b'y'; 200], |l| out.extend_from_slice(l));
        s.finish(|l| out.extend_from_slice(l));
        let text = String::from_utf8(out).unwrap();
        assert!(!text.contains("s3cr3t-VALUE/with+chars"));
        assert!(text.contains("[REDACTED:TOKEN]"));
    }

    #[test]
    fn credential_shapes_are_found() {
        let aws = format!("AKIA{}", "ABCDEFGHIJKLMNOP");
        let gh = format!("ghp_{}", "a".repeat(36));
        let text = format!("key {aws} and {gh} and -----BEGIN OPENSSH PRIVATE KEY-----\nabc\n-----END OPENSSH PRIVATE KEY----- done");
        let hits = find_credentials(&text);
        let rules: Vec<_> = hits.iter().map(|h| h.2).collect();
        assert_eq!(
            rules,
            vec![
                Reason::CredentialAwsAccessKey,
                Reason::CredentialGithub,
                Reason::CredentialPrivateKey
            ]
        );
        let out = redact_credentials(&text, &hits);
        assert!(!out.contains("AKIA") && !out.contains("ghp_") && !out.contains("abc"));
        assert!(out.ends_with(" done"));
        assert!(find_credentials("task-list and risk-assessment AKIAshort").is_empty());
    }
}
