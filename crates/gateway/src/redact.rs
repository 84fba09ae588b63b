//! Redaction of secret values (and their encodings) and detection of
//! credential-shaped strings.
//!
//! Matching works on decoded text (JSON string values after parsing, or raw
//! stderr bytes), so escaped forms such as `\u0041` in the JSON wire format
//! cannot slip past.
//!
//! # How matching is done
//!
//! Every secret yields up to a dozen patterns (the value, hex, URL-encoding,
//! base64 in both alphabets at the three stream alignments). All patterns
//! of all secrets are searched at once, so a string is read once, however
//! many patterns there are: a SIMD multi-pattern search (Teddy) finds where
//! patterns occur, and a DFA reports *every* occurrence (overlapping
//! search) in those places only (see `Searcher`). The selection then does
//! exactly what one `memmem` pass per pattern used to
//! (the reference kept in `redact/reference.rs` for the equivalence tests):
//! per pattern, leftmost non-overlapping occurrences; all of them sorted by
//! start, widest first, pattern order breaking ties; overlapping ones
//! merged, the first one's secret naming the merged range. The selection
//! is done online as the matches stream by, so memory is proportional to
//! the matches kept, as before, never to all overlapping occurrences.
//!
//! Credential shapes are found the same way: one automaton over the shape
//! prefixes finds the few places where a shape can start, and the shape
//! rules run only there.
//!
//! Dependencies: `aho-corasick` (no default features; `std` and
//! `perf-literal`, its SIMD prefilter) for the multi-pattern search, and
//! `memchr` (already used for line splitting) for single-needle search.

use std::borrow::Cow;
use std::sync::OnceLock;

use aho_corasick::{AhoCorasick, AhoCorasickKind, MatchKind};
use serde_json::Value;

#[cfg(test)]
mod reference;

use mcpbox_policy::Reason;

/// One pattern: bytes to find and the index of the secret it belongs to.
#[derive(Debug, Clone)]
struct Pattern {
    bytes: Vec<u8>,
    secret: usize,
}

/// Finds and replaces secret values in every encoding mcpbox knows.
#[derive(Debug, Clone, Default)]
pub struct Redactor {
    names: Vec<String>,
    replacements: Vec<String>,
    /// Sorted longest first so the widest match wins at a position; among
    /// patterns of one length, by secret, then bytewise. A pattern's index
    /// here is its id in `searcher` and its rank when two matches cover the
    /// same span.
    patterns: Vec<Pattern>,
    max_len: usize,
    /// The automata over all patterns; `None` only when there are none (or
    /// they could not be built, when a slower search is used).
    searcher: Option<Searcher>,
}

/// Two searches over the same patterns (pattern id = index in
/// `Redactor::patterns`).
///
/// `candidates` is a leftmost non-overlapping search (Teddy, SIMD, when
/// the pattern set allows; else a leftmost-first automaton), run over the
/// whole text: it says *where* patterns occur at multi-GB/s. Every
/// occurrence of every pattern starts inside one of its matches (no
/// occurrence can start before the leftmost one, nor between one match's
/// end and the next's start), so the exhaustive overlapping search
/// (`all`, a DFA) only runs over each candidate match extended by
/// `max_len - 1` bytes. Standard (overlapping) semantics cannot use Teddy,
/// and its byte-frequency prefilter is slow on ordinary text; this split
/// keeps clean text at the prefilter's speed.
#[derive(Debug, Clone)]
struct Searcher {
    candidates: Candidates,
    all: AhoCorasick,
}

#[derive(Debug, Clone)]
enum Candidates {
    Packed(aho_corasick::packed::Searcher),
    Automaton(AhoCorasick),
}

impl Searcher {
    fn new(patterns: &[Pattern]) -> Result<Searcher, aho_corasick::BuildError> {
        let bytes = || patterns.iter().map(|p| &p.bytes);
        let all = AhoCorasick::builder()
            .match_kind(MatchKind::Standard)
            .kind(Some(AhoCorasickKind::DFA))
            .prefilter(false)
            .build(bytes())
            .or_else(|_| {
                AhoCorasick::builder()
                    .match_kind(MatchKind::Standard)
                    .build(bytes())
            })?;
        let candidates = match aho_corasick::packed::Config::new()
            .match_kind(aho_corasick::packed::MatchKind::LeftmostFirst)
            .builder()
            .extend(bytes())
            .build()
        {
            Some(p) => Candidates::Packed(p),
            None => Candidates::Automaton(
                AhoCorasick::builder()
                    .match_kind(MatchKind::LeftmostFirst)
                    .build(bytes())?,
            ),
        };
        Ok(Searcher { candidates, all })
    }

    /// The leftmost match starting at or after `at`: (start, end).
    fn candidate(&self, hay: &[u8], at: usize) -> Option<(usize, usize)> {
        let m = match &self.candidates {
            Candidates::Packed(p) => p.find_in(hay, aho_corasick::Span::from(at..hay.len())),
            Candidates::Automaton(ac) => ac.find(aho_corasick::Input::new(hay).range(at..)),
        }?;
        Some((m.start(), m.end()))
    }

    /// Calls `f(start, end, pattern)` on every occurrence of every pattern,
    /// overlapping ones included, ordered by end (hence one pattern's by
    /// start); `reach` is the longest pattern's length minus one.
    fn each(&self, hay: &[u8], reach: usize, mut f: impl FnMut(usize, usize, usize)) {
        let mut region: Option<(usize, usize)> = None;
        let mut at = 0;
        let mut run = |from: usize, to: usize| {
            let input = aho_corasick::Input::new(hay).range(from..to);
            for m in self.all.find_overlapping_iter(input) {
                f(m.start(), m.end(), m.pattern().as_usize());
            }
        };
        while let Some((start, end)) = self.candidate(hay, at) {
            let to = (end + reach).min(hay.len());
            region = match region {
                // overlapping regions are searched as one, so no occurrence
                // is reported twice
                Some((from, last)) if start < last => Some((from, last.max(to))),
                Some((from, last)) => {
                    run(from, last);
                    Some((start, to))
                }
                None => Some((start, to)),
            };
            at = end;
        }
        if let Some((from, last)) = region {
            run(from, last);
        }
    }
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
                r.patterns.push(Pattern { bytes, secret: idx });
            }
        }
        // stable: the order above breaks ties between equal lengths
        r.patterns.sort_by_key(|p| std::cmp::Reverse(p.bytes.len()));
        if !r.patterns.is_empty() {
            r.searcher = Searcher::new(&r.patterns)
                .map_err(|e| tracing::warn!("secret patterns: no automaton ({e}); slow search"))
                .ok();
        }
        r
    }

    /// Test hook: the searches used where Teddy is unavailable (`1`: the
    /// leftmost-first automaton finds candidates) or no automaton could be
    /// built (`2`: one `memmem` scan per pattern).
    #[cfg(test)]
    fn force_fallback(&mut self, mode: u8) {
        if mode == 2 {
            self.searcher = None;
        } else if let Some(searcher) = self.searcher.as_mut() {
            if let Ok(ac) = AhoCorasick::builder()
                .match_kind(MatchKind::LeftmostFirst)
                .build(self.patterns.iter().map(|p| &p.bytes))
            {
                searcher.candidates = Candidates::Automaton(ac);
            }
        }
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

    /// Whether any pattern occurs anywhere in `hay` (the question every
    /// clean string asks; cheaper than [`Redactor::find`]).
    pub fn occurs_in(&self, hay: &[u8]) -> bool {
        if self.patterns.is_empty() || hay.len() < self.min_len() {
            return false;
        }
        match &self.searcher {
            Some(searcher) => searcher.candidate(hay, 0).is_some(),
            None => self
                .patterns
                .iter()
                .any(|p| memchr::memmem::find(hay, &p.bytes).is_some()),
        }
    }

    /// Finds the merged match ranges in `hay`: (start, end, secret index).
    pub fn find(&self, hay: &[u8]) -> Vec<(usize, usize, usize)> {
        if self.patterns.is_empty() || hay.len() < self.min_len() {
            return Vec::new();
        }
        // per pattern, where its next occurrence may start: one memmem pass
        // per pattern took the leftmost occurrence, then searched on from
        // its end
        let mut next = vec![0usize; self.patterns.len()];
        // (start, end, pattern)
        let mut hits: Vec<(usize, usize, usize)> = Vec::new();
        let mut take = |start: usize, end: usize, p: usize| {
            if start >= next[p] {
                next[p] = end;
                hits.push((start, end, p));
            }
        };
        match &self.searcher {
            // occurrences come by end offset, so one pattern's (all of one
            // length) come by start too: `take` sees them in the order its
            // own pass would have
            Some(searcher) => searcher.each(hay, self.max_len - 1, &mut take),
            None => {
                for (p, pat) in self.patterns.iter().enumerate() {
                    let finder = memchr::memmem::Finder::new(&pat.bytes);
                    let mut i = 0;
                    while let Some(off) = finder.find(&hay[i..]) {
                        take(i + off, i + off + pat.bytes.len(), p);
                        i += off + 1;
                    }
                }
            }
        }
        if hits.len() <= 1 {
            return hits
                .into_iter()
                .map(|(s, e, p)| (s, e, self.patterns[p].secret))
                .collect();
        }
        // by start, widest first, then pattern order (the old stable sort
        // of hits listed pattern by pattern)
        hits.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)).then(a.2.cmp(&b.2)));
        let mut merged: Vec<(usize, usize, usize)> = Vec::with_capacity(hits.len());
        for (start, end, p) in hits {
            match merged.last_mut() {
                Some(last) if start < last.1 => last.1 = last.1.max(end),
                _ => merged.push((start, end, self.patterns[p].secret)),
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
    ///
    /// The concatenation is only built when some pattern occurs in a piece
    /// or in the window of `max_len - 1` bytes either side of a boundary
    /// between pieces; otherwise nothing can span one.
    pub fn redact_across(&self, pieces: &mut [&mut String], counts: &mut [usize]) -> bool {
        if self.patterns.is_empty() || pieces.len() < 2 {
            return false;
        }
        let clean = vec![false; pieces.len()];
        self.redact_across_known(pieces, &clean, counts)
    }

    /// [`Redactor::redact_across`] where `known_clean[i]` says that no
    /// pattern occurs in `pieces[i]` (so it is not searched again).
    fn redact_across_known(
        &self,
        pieces: &mut [&mut String],
        known_clean: &[bool],
        counts: &mut [usize],
    ) -> bool {
        if self.patterns.is_empty() || pieces.len() < 2 {
            return false;
        }
        let views: Vec<&[u8]> = pieces.iter().map(|p| p.as_bytes()).collect();
        if !self.may_span(&views, known_clean) {
            return false;
        }
        self.redact_across_all(pieces, counts)
    }

    /// Whether any pattern occurs in a piece not known clean, or near a
    /// boundary between two pieces. When not, the concatenation holds no
    /// match at all.
    fn may_span(&self, pieces: &[&[u8]], known_clean: &[bool]) -> bool {
        for (i, p) in pieces.iter().enumerate() {
            if !known_clean.get(i).copied().unwrap_or(false) && self.occurs_in(p) {
                return true;
            }
        }
        // a match spanning a boundary at offset b lies within
        // [b - (max_len - 1), b + (max_len - 1))
        let reach = self.max_len.saturating_sub(1);
        let total: usize = pieces.iter().map(|p| p.len()).sum();
        let mut window = Vec::with_capacity(2 * reach);
        let mut boundary = 0;
        for p in &pieces[..pieces.len() - 1] {
            boundary += p.len();
            let (from, to) = (
                boundary.saturating_sub(reach),
                (boundary + reach).min(total),
            );
            window.clear();
            let mut off = 0;
            for q in pieces {
                let (qs, qe) = (off, off + q.len());
                off = qe;
                if qe <= from || qs >= to {
                    continue;
                }
                window.extend_from_slice(&q[from.max(qs) - qs..to.min(qe) - qs]);
            }
            if self.occurs_in(&window) {
                return true;
            }
        }
        false
    }

    /// The concatenation search of [`Redactor::redact_across`].
    fn redact_across_all(&self, pieces: &mut [&mut String], counts: &mut [usize]) -> bool {
        let mut concat = String::with_capacity(pieces.iter().map(|p| p.len()).sum());
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

    /// Redacts a whole JSON-RPC message from the server, in place: every
    /// string value and every object key (as [`Redactor::redact_str`]; a
    /// key that redacts to one already present replaces it), then matches
    /// spanning the `text` strings of `/result/content` items (as
    /// [`Redactor::redact_across`]). Adds to `counts` (one slot per secret,
    /// [`Redactor::names`] order) and returns whether anything changed;
    /// when not, the original line can be sent as it was.
    ///
    /// This is what the relay did with two walks and a concatenation; here
    /// each string is searched once, and the content texts are searched
    /// again only around their boundaries (and only those a secret was cut
    /// out of are searched whole again). Equal, result for result, to
    /// `redact_str` on every string in walk order followed by
    /// `redact_across` on the content texts.
    ///
    /// How a session calls it, once per server line: parse with
    /// [`crate::lines::parse_json`] (duplicate keys refused, so the parsed
    /// value holds every byte the line does); for a message with
    /// `original_len` (compacted), [`Redactor::strip_cut_json`] first; the
    /// result screening (credential shapes, `sanitize`, truncation); then
    /// this, with one `counts` slot per secret, and one audit record per
    /// secret whose count is non-zero. If nothing changed anywhere, send
    /// the original line; otherwise serialise the value once.
    pub fn redact_json(&self, v: &mut Value, counts: &mut [usize]) -> bool {
        if self.patterns.is_empty() {
            return false;
        }
        // whether each /result/content text (in order) was rewritten
        let mut content_changed: Vec<bool> = Vec::new();
        let mut changed = self.walk_redact(v, Place::Root, &mut content_changed, counts);
        if content_changed.len() >= 2 {
            if let Some(Value::Array(items)) = v.pointer_mut("/result/content") {
                let mut texts: Vec<&mut String> = items
                    .iter_mut()
                    .filter_map(|item| match item.get_mut("text") {
                        Some(Value::String(t)) => Some(t),
                        _ => None,
                    })
                    .collect();
                // a text left as it was has no pattern in it; one that was
                // rewritten is searched again (the label's edges)
                let clean: Vec<bool> = if content_changed.len() == texts.len() {
                    content_changed.iter().map(|c| !c).collect()
                } else {
                    vec![false; texts.len()]
                };
                changed |= self.redact_across_known(&mut texts, &clean, counts);
            }
        }
        changed
    }

    /// `walk_strings` of the relay with `redact_str`, tracking where in
    /// the message it is so that the content texts are known.
    fn walk_redact(
        &self,
        v: &mut Value,
        at: Place,
        content: &mut Vec<bool>,
        counts: &mut [usize],
    ) -> bool {
        match v {
            Value::String(s) => {
                let fixed = match self.redact_str(s, counts) {
                    Cow::Borrowed(_) => None,
                    Cow::Owned(o) => Some(o),
                };
                let changed = fixed.is_some();
                if let Some(n) = fixed {
                    *s = n;
                }
                if at == Place::ContentText {
                    content.push(changed);
                }
                changed
            }
            Value::Array(a) => {
                let inner = if at == Place::Content {
                    Place::ContentItem
                } else {
                    Place::Other
                };
                let mut changed = false;
                for x in a {
                    changed |= self.walk_redact(x, inner, content, counts);
                }
                changed
            }
            Value::Object(m) => {
                let mut changed = false;
                let renames: Vec<(String, String)> = m
                    .keys()
                    .filter_map(|k| match self.redact_str(k, counts) {
                        Cow::Borrowed(_) => None,
                        Cow::Owned(n) => Some((k.clone(), n)),
                    })
                    .collect();
                for (old, new) in renames {
                    if let Some(x) = m.remove(&old) {
                        m.insert(new, x);
                        changed = true;
                    }
                }
                for (k, x) in m.iter_mut() {
                    let inner = match (at, k.as_str()) {
                        (Place::Root, "result") => Place::Result,
                        (Place::Result, "content") => Place::Content,
                        (Place::ContentItem, "text") => Place::ContentText,
                        _ => Place::Other,
                    };
                    changed |= self.walk_redact(x, inner, content, counts);
                }
                changed
            }
            _ => false,
        }
    }

    /// For a message whose long strings were cut by [`crate::compact`]:
    /// in every string (and key) holding the truncation marker, removes a
    /// partial secret left just before the last marker (as
    /// [`Redactor::strip_partial_tail`]). Returns whether anything changed.
    pub fn strip_cut_json(&self, v: &mut Value, counts: &mut [usize]) -> bool {
        if self.patterns.is_empty() {
            return false;
        }
        let marker = format!("\n{}", crate::compact::MARKER_PREFIX);
        let finder = memchr::memmem::FinderRev::new(marker.as_bytes());
        walk_strings(v, &mut |s| {
            let at = finder.rfind(s.as_bytes())?;
            let fixed = self.strip_partial_tail(&s[..at], counts)?;
            Some(format!("{fixed}{}", &s[at..]))
        })
    }
}

/// Where [`Redactor::walk_redact`] is: on the way to `/result/content/*/text`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    Root,
    Result,
    Content,
    ContentItem,
    ContentText,
    Other,
}

/// Calls `f` on every string (object keys included); replaces the ones for
/// which it returns a new value. Returns whether anything changed. (The
/// relay's walk, for [`Redactor::strip_cut_json`].)
fn walk_strings(v: &mut Value, f: &mut dyn FnMut(&str) -> Option<String>) -> bool {
    match v {
        Value::String(s) => match f(s) {
            Some(n) => {
                *s = n;
                true
            }
            None => false,
        },
        Value::Array(a) => {
            let mut changed = false;
            for x in a {
                changed |= walk_strings(x, f);
            }
            changed
        }
        Value::Object(m) => {
            let mut changed = false;
            let renames: Vec<(String, String)> = m
                .keys()
                .filter_map(|k| f(k).map(|n| (k.clone(), n)))
                .collect();
            for (old, new) in renames {
                if let Some(x) = m.remove(&old) {
                    m.insert(new, x);
                    changed = true;
                }
            }
            for (_, x) in m.iter_mut() {
                changed |= walk_strings(x, f);
            }
            changed
        }
        _ => false,
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

/// One automaton over the shape prefixes: where a credential can start.
fn shape_starts() -> Option<&'static AhoCorasick> {
    static STARTS: OnceLock<Option<AhoCorasick>> = OnceLock::new();
    STARTS
        .get_or_init(|| {
            AhoCorasick::builder()
                .match_kind(MatchKind::LeftmostFirst)
                .build(SHAPES.iter().map(|s| s.prefix))
                .ok()
        })
        .as_ref()
}

/// The credential shapes found in `s`, as (start, end, rule).
pub fn find_credentials(s: &str) -> Vec<(usize, usize, Reason)> {
    let b = s.as_bytes();
    let mut hits = Vec::new();
    // PEM private key blocks: from BEGIN to the matching END line, or to
    // the end of the text when it was cut.
    let mut from = 0;
    while let Some(off) = memchr::memmem::find(&b[from..], PEM_BEGIN.as_bytes()) {
        let start = from + off;
        let header_end = memchr::memchr(b'\n', &b[start..]).map_or(s.len(), |n| start + n);
        if memchr::memmem::find(&b[start..header_end], PEM_KEY.as_bytes()).is_some() {
            let end = match memchr::memmem::find(&b[header_end..], b"-----END ") {
                Some(e) => {
                    let e = header_end + e;
                    match memchr::memmem::find(&b[e..], PEM_KEY.as_bytes()) {
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
    // Every shape starts with its prefix, so only where some prefix starts
    // can one match: the automaton jumps from one such place to the next
    // (leftmost start first), and the rules run there as they would have
    // at every byte.
    let mut i = 0;
    while i < b.len() {
        let at = match shape_starts() {
            Some(ac) => match ac.find(&b[i..]) {
                Some(m) => i + m.start(),
                None => break,
            },
            None => i,
        };
        match shape_at(b, at) {
            Some(m) => {
                if !hits
                    .iter()
                    .any(|h: &(usize, usize, Reason)| m.0 < h.1 && h.0 < m.1)
                {
                    hits.push(m);
                }
                i = m.1;
            }
            None => i = at + 1,
        }
    }
    hits.sort_by_key(|h| h.0);
    hits
}

/// The credential shape starting at `i`, if one does.
fn shape_at(b: &[u8], i: usize) -> Option<(usize, usize, Reason)> {
    let at_boundary = i == 0 || !alnum_us(b[i - 1]);
    if !at_boundary || !b[i].is_ascii_alphabetic() {
        return None;
    }
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
                return Some((i, j, shape.rule));
            }
        }
    }
    None
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
    use serde_json::json;

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
    // ---- equivalence with the reference (the pre-automaton code) ----------

    /// xorshift64*: deterministic, no dependency.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n.max(1) as u64) as usize
        }
        fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
            &xs[self.below(xs.len())]
        }
    }

    /// A secret value of a kind that stresses one thing or another.
    fn gen_secret(rng: &mut Rng) -> String {
        const ALNUM: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
        match rng.below(8) {
            // token-like
            0 | 1 => (0..8 + rng.below(30))
                .map(|_| char::from(*rng.pick(ALNUM)))
                .collect(),
            // with characters every encoding treats differently
            2 => (0..4 + rng.below(20))
                .map(|_| *rng.pick(&['a', 'Z', '9', '/', '+', '-', '_', ' ', '%', '=', '.', '~']))
                .collect(),
            // self-overlapping: chains of overlapping occurrences
            3 => {
                let unit: String = (0..1 + rng.below(3))
                    .map(|_| *rng.pick(&['a', 'b', 'c']))
                    .collect();
                let mut v = unit.repeat(2 + rng.below(4));
                if rng.below(2) == 0 {
                    v.push_str(&unit[..1]);
                }
                v
            }
            // non-ASCII: matches and labels next to UTF-8 boundaries
            4 => (0..2 + rng.below(8))
                .map(|_| *rng.pick(&['é', 'a', '😀', 'ß', '-']))
                .collect(),
            // very short (only the plain form is a pattern)
            5 => (0..1 + rng.below(3))
                .map(|_| *rng.pick(&['a', 'b', 'é', 'Z']))
                .collect(),
            // what the filler is made of, so accidental matches happen
            6 => (0..3 + rng.below(6))
                .map(|_| *rng.pick(&['a', 'b', 'Y', 'W', 'F', 'h', '6', '1']))
                .collect(),
            _ => "s3cr3t-VALUE/with+chars".to_string(),
        }
    }

    fn gen_secrets(rng: &mut Rng) -> Vec<(String, String)> {
        let n = 1 + rng.below(3);
        let mut out: Vec<(String, String)> = Vec::new();
        for i in 0..n {
            let value = match rng.below(6) {
                // a duplicate of an earlier value (same patterns, two secrets)
                0 if !out.is_empty() => out[rng.below(out.len())].1.clone(),
                // a value inside another
                1 if out.iter().any(|(_, v)| !v.is_empty()) => {
                    let full: Vec<&String> = out
                        .iter()
                        .map(|(_, v)| v)
                        .filter(|v| !v.is_empty())
                        .collect();
                    let cs: Vec<char> = rng.pick(&full).chars().collect();
                    let a = rng.below(cs.len());
                    let b = a + 1 + rng.below(cs.len() - a);
                    cs[a..b].iter().collect()
                }
                2 => String::new(), // ignored
                _ => gen_secret(rng),
            };
            out.push((format!("S{i}"), value));
        }
        out
    }

    /// Every form a value can take in a haystack, and base64 of it inside
    /// a longer stream at each alignment.
    fn encodings(value: &str, rng: &mut Rng) -> Vec<String> {
        let v = value.as_bytes();
        let mut out = vec![
            value.to_string(),
            crate::digest::hex_lower(v),
            crate::digest::hex_lower(v).to_ascii_uppercase(),
            url_encode(v, true),
            url_encode(v, false),
            url_encode(v, true).replace("%20", "+"),
        ];
        for alphabet in [B64_STD, B64_URL] {
            out.push(base64(v, alphabet, true));
            out.push(base64(v, alphabet, false));
            let mut data = b"xyz"[..rng.below(4)].to_vec();
            data.extend_from_slice(v);
            data.extend_from_slice(&b"tail!"[..rng.below(6)]);
            out.push(base64(&data, alphabet, rng.below(2) == 0));
        }
        out
    }

    /// A haystack: filler, encodings, their halves, overlapping repeats.
    fn gen_hay(rng: &mut Rng, secrets: &[(String, String)]) -> String {
        let filler = [
            'a', 'b', 'x', 'Y', 'W', '0', '=', '%', '+', '/', ' ', 'é', '😀', '\n',
        ];
        let mut hay = String::new();
        for _ in 0..rng.below(12) {
            match rng.below(6) {
                0 | 1 => {
                    for _ in 0..rng.below(20) {
                        hay.push(*rng.pick(&filler));
                    }
                }
                _ => {
                    let (_, value) = rng.pick(secrets);
                    if value.is_empty() {
                        continue;
                    }
                    let encs = encodings(value, rng);
                    let e = rng.pick(&encs).clone();
                    let cs: Vec<char> = e.chars().collect();
                    match rng.below(5) {
                        // a prefix or suffix only
                        0 => hay.extend(&cs[..rng.below(cs.len() + 1)]),
                        1 => hay.extend(&cs[rng.below(cs.len() + 1)..]),
                        // overlapping repeats: e then e without its head
                        2 => {
                            hay.push_str(&e);
                            hay.extend(&cs[rng.below(cs.len())..]);
                            hay.push_str(&e);
                        }
                        _ => hay.push_str(&e),
                    }
                }
            }
        }
        hay
    }

    fn pair(secrets: &[(String, String)]) -> (Redactor, reference::Redactor) {
        let it = || secrets.iter().map(|(n, v)| (n.as_str(), v.as_bytes()));
        (Redactor::new(it()), reference::Redactor::new(it()))
    }

    /// Every search path the redactor can take (Teddy, the automaton
    /// fallback, memmem) against the reference.
    #[test]
    fn fallback_searches_equal_the_reference() {
        let mut rng = Rng(0xFA11_BAC4_0000_0005);
        for round in 0..1500 {
            let secrets = gen_secrets(&mut rng);
            let (mut new, old) = pair(&secrets);
            new.force_fallback(1 + (round % 2) as u8);
            for _ in 0..4 {
                let hay = gen_hay(&mut rng, &secrets);
                let b = hay.as_bytes();
                assert_eq!(
                    new.find(b),
                    old.find(b),
                    "round {round} {secrets:?} {hay:?}"
                );
                assert_eq!(new.occurs_in(b), !old.find(b).is_empty());
            }
        }
    }

    /// Splits `s` at `n` random char boundaries.
    fn split(rng: &mut Rng, s: &str, n: usize) -> Vec<String> {
        let bounds: Vec<usize> = (0..=s.len()).filter(|&i| s.is_char_boundary(i)).collect();
        let mut cuts: Vec<usize> = (0..n).map(|_| *rng.pick(&bounds)).collect();
        cuts.sort_unstable();
        let mut out = Vec::new();
        let mut prev = 0;
        for c in cuts {
            out.push(s[prev..c].to_string());
            prev = c;
        }
        out.push(s[prev..].to_string());
        out
    }

    /// The relay's `redact_secrets` (a walk with `redact_str`, then
    /// `redact_across` on the content texts), on the reference redactor.
    fn relay_redact_secrets(r: &reference::Redactor, v: &mut Value, counts: &mut [usize]) -> bool {
        fn walk(v: &mut Value, f: &mut dyn FnMut(&str) -> Option<String>) -> bool {
            match v {
                Value::String(s) => match f(s) {
                    Some(n) => {
                        *s = n;
                        true
                    }
                    None => false,
                },
                Value::Array(a) => {
                    let mut changed = false;
                    for x in a {
                        changed |= walk(x, f);
                    }
                    changed
                }
                Value::Object(m) => {
                    let mut changed = false;
                    let renames: Vec<(String, String)> = m
                        .keys()
                        .filter_map(|k| f(k).map(|n| (k.clone(), n)))
                        .collect();
                    for (old, new) in renames {
                        if let Some(x) = m.remove(&old) {
                            m.insert(new, x);
                            changed = true;
                        }
                    }
                    for (_, x) in m.iter_mut() {
                        changed |= walk(x, f);
                    }
                    changed
                }
                _ => false,
            }
        }
        if r.is_empty() {
            return false;
        }
        let mut changed = walk(v, &mut |s| match r.redact_str(s, counts) {
            Cow::Borrowed(_) => None,
            Cow::Owned(o) => Some(o),
        });
        if let Some(Value::Array(items)) = v.pointer_mut("/result/content") {
            let mut texts: Vec<&mut String> = items
                .iter_mut()
                .filter_map(|item| match item.get_mut("text") {
                    Some(Value::String(t)) => Some(t),
                    _ => None,
                })
                .collect();
            changed |= r.redact_across(&mut texts, counts);
        }
        changed
    }

    #[test]
    fn redactor_equals_the_reference_on_generated_inputs() {
        let mut rng = Rng(0x0DDB_1A5E_5BAD_5EED);
        for round in 0..3000 {
            let secrets = gen_secrets(&mut rng);
            let (new, old) = pair(&secrets);
            assert_eq!(new.names(), old.names());
            assert_eq!(new.max_len(), old.max_len());
            assert_eq!(new.is_empty(), old.is_empty());
            let n = new.names().len();
            for _ in 0..8 {
                let hay = gen_hay(&mut rng, &secrets);
                let ctx = format!("round {round} secrets {secrets:?} hay {hay:?}");
                let b = hay.as_bytes();
                assert_eq!(new.find(b), old.find(b), "find: {ctx}");
                assert_eq!(
                    new.occurs_in(b),
                    !old.find(b).is_empty(),
                    "occurs_in: {ctx}"
                );
                let (mut c1, mut c2) = (vec![0; n], vec![0; n]);
                let (r1, r2) = (new.redact_str(&hay, &mut c1), old.redact_str(&hay, &mut c2));
                assert_eq!(r1, r2, "redact_str: {ctx}");
                assert_eq!(
                    matches!(r1, Cow::Owned(_)),
                    matches!(r2, Cow::Owned(_)),
                    "{ctx}"
                );
                assert_eq!(c1, c2, "redact_str counts: {ctx}");
                assert_eq!(
                    new.redact_bytes(b, &mut c1),
                    old.redact_bytes(b, &mut c2),
                    "redact_bytes: {ctx}"
                );
                assert_eq!(new.safe_prefix(b), old.safe_prefix(b), "safe_prefix: {ctx}");
                assert_eq!(
                    new.strip_partial_tail(&hay, &mut c1),
                    old.strip_partial_tail(&hay, &mut c2),
                    "strip_partial_tail: {ctx}"
                );
                // raw bytes cut anywhere, even inside a character
                let cut = rng.below(b.len() + 1);
                assert_eq!(new.find(&b[cut..]), old.find(&b[cut..]), "find tail: {ctx}");
                // split into pieces at char boundaries (some empty)
                let k = 1 + rng.below(5);
                let mut p1 = split(&mut rng, &hay, k);
                let mut p2 = p1.clone();
                let ch1 = new.redact_across(&mut p1.iter_mut().collect::<Vec<_>>(), &mut c1);
                let ch2 = old.redact_across(&mut p2.iter_mut().collect::<Vec<_>>(), &mut c2);
                assert_eq!((ch1, &p1), (ch2, &p2), "redact_across: {ctx}");
                assert_eq!(c1, c2, "counts: {ctx}");
            }
        }
    }

    #[test]
    fn redact_json_equals_the_relay_walk_on_generated_messages() {
        let mut rng = Rng(0x5EC2_E7A1_1CE5_0001);
        for round in 0..2000 {
            let secrets = gen_secrets(&mut rng);
            let (new, old) = pair(&secrets);
            let n = new.names().len();
            let hay = gen_hay(&mut rng, &secrets);
            let k = rng.below(5);
            let pieces = split(&mut rng, &hay, k);
            let mut content: Vec<Value> = Vec::new();
            for p in &pieces {
                match rng.below(6) {
                    0 => content.push(json!({"type": "image", "data": p})),
                    1 => content.push(json!({"type": "text", "text": p, p.clone(): p})),
                    2 => content.push(json!([p])),
                    _ => content.push(json!({"type": "text", "text": p})),
                }
            }
            let key = gen_hay(&mut rng, &secrets);
            let mut msg = match rng.below(4) {
                0 => json!({"jsonrpc": "2.0", "method": "notifications/message",
                            "params": {"data": hay, key.clone(): [key, 1, null]}}),
                1 => json!({"jsonrpc": "2.0", "id": 1, "result": {"content": {"text": hay}}}),
                _ => json!({"jsonrpc": "2.0", "id": 1, "result": {"content": content,
                            "structuredContent": {key.clone(): key, "n": [pieces]}}}),
            };
            // (and lines::parse_json reads what serde_json writes, as serde_json does)
            let line = serde_json::to_vec(&msg).unwrap();
            assert_eq!(crate::lines::parse_json(&line).unwrap(), msg);
            let mut want = msg.clone();
            let (mut c1, mut c2) = (vec![0; n], vec![0; n]);
            let ch1 = new.redact_json(&mut msg, &mut c1);
            let ch2 = relay_redact_secrets(&old, &mut want, &mut c2);
            let ctx = format!("round {round} secrets {secrets:?} message {want}");
            assert_eq!(msg, want, "{ctx}");
            assert_eq!((ch1, &c1), (ch2, &c2), "{ctx}");
        }
    }

    #[test]
    fn strip_cut_json_equals_the_relay_walk() {
        let mut rng = Rng(0xC077_0FF5_0000_0002);
        let marker = format!("\n{}", crate::compact::MARKER_PREFIX);
        for round in 0..2000 {
            let secrets = gen_secrets(&mut rng);
            let (new, old) = pair(&secrets);
            let n = new.names().len();
            let mut texts = Vec::new();
            for _ in 0..3 {
                let mut t = gen_hay(&mut rng, &secrets);
                if rng.below(3) > 0 {
                    t.push_str(&format!("{marker}12 bytes]"));
                }
                texts.push(t);
            }
            let mut msg = json!({"id": 1, "result": {"content": [{"type": "text", "text": texts[0]}],
                                 texts[1].clone(): texts[2]}});
            let mut want = msg.clone();
            let (mut c1, mut c2) = (vec![0; n], vec![0; n]);
            let ch1 = new.strip_cut_json(&mut msg, &mut c1);
            // relay.rs strip_cut_secrets on the reference
            let ch2 = !old.is_empty()
                && walk_strings(&mut want, &mut |s| {
                    let at = s.rfind(&marker)?;
                    let fixed = old.strip_partial_tail(&s[..at], &mut c2)?;
                    Some(format!("{fixed}{}", &s[at..]))
                });
            assert_eq!(
                (ch1, &msg, &c1),
                (ch2, &want, &c2),
                "round {round} {secrets:?}"
            );
        }
    }

    #[test]
    fn stream_redactor_equals_the_reference_under_any_chunking() {
        let mut rng = Rng(0x57E4_A11E_0000_0003);
        for round in 0..1500 {
            let secrets = gen_secrets(&mut rng);
            let (new, old) = pair(&secrets);
            let max_buf = 1 + rng.below(120);
            let mut a = StreamRedactor::new(new, max_buf);
            let mut b = reference::StreamRedactor::new(old, max_buf);
            let mut data = Vec::new();
            for _ in 0..1 + rng.below(6) {
                data.extend_from_slice(gen_hay(&mut rng, &secrets).as_bytes());
                if rng.below(2) == 0 {
                    data.push(b'\n');
                }
            }
            let (mut out_a, mut out_b) = (Vec::new(), Vec::new());
            let mut i = 0;
            while i < data.len() {
                let span = if rng.below(2) == 0 { 8 } else { 200 };
                let step = 1 + rng.below(span);
                let chunk = &data[i..(i + step).min(data.len())];
                a.push(chunk, |l| out_a.push(l.to_vec()));
                b.push(chunk, |l| out_b.push(l.to_vec()));
                i += step;
            }
            a.finish(|l| out_a.push(l.to_vec()));
            b.finish(|l| out_b.push(l.to_vec()));
            assert_eq!(
                out_a,
                out_b,
                "round {round} {secrets:?} {:?}",
                String::from_utf8_lossy(&data)
            );
            assert_eq!(a.counts, b.counts);
        }
    }

    #[test]
    fn find_credentials_equals_the_reference_on_generated_text() {
        let mut rng = Rng(0xC2ED_0000_0000_0004);
        let parts: Vec<String> = SHAPES
            .iter()
            .map(|s| s.prefix.to_string())
            .chain(
                [
                    "-----BEGIN ",
                    "RSA PRIVATE KEY-----",
                    "-----END ",
                    "PRIVATE KEY-----",
                    "CERTIFICATE-----",
                    "\n",
                    " ",
                    "_",
                    "-",
                    "x",
                    "é",
                    "AAAAAAAA",
                    "abcdefgh",
                    "0123456789",
                    "ABCDEFGHIJKLMNOP",
                    "QRSTUVWXYZ012345",
                ]
                .iter()
                .map(|s| s.to_string()),
            )
            .collect();
        for round in 0..20_000 {
            let mut s = String::new();
            for _ in 0..rng.below(30) {
                let p = rng.pick(&parts);
                s.push_str(&p.repeat(1 + rng.below(if p.len() > 4 { 2 } else { 12 })));
            }
            let got = find_credentials(&s);
            let want = reference::find_credentials(&s);
            let got_codes: Vec<(usize, usize, &str)> =
                got.iter().map(|h| (h.0, h.1, h.2.as_str())).collect();
            assert_eq!(got_codes, want, "round {round} {s:?}");
            let want_hits: Vec<(usize, usize, Reason)> = want
                .iter()
                .map(|h| (h.0, h.1, Reason::from_code(h.2).unwrap()))
                .collect();
            assert_eq!(
                redact_credentials(&s, &got),
                redact_credentials(&s, &want_hits)
            );
        }
    }

    #[test]
    fn duplicate_secret_values_count_for_the_first_secret() {
        let red = Redactor::new([("A", &b"same-value"[..]), ("B", &b"same-value"[..])]);
        let mut counts = vec![0, 0];
        assert_eq!(
            red.redact_str("x same-value y", &mut counts),
            "x [REDACTED:A] y"
        );
        assert_eq!(counts, vec![1, 0]);
    }
}
