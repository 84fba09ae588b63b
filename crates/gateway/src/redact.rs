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

use aho_corasick::{AhoCorasick, AhoCorasickKind, MatchKind};
use serde_json::Value;

#[cfg(test)]
mod reference;
mod shapes;
mod stream;
#[cfg(test)]
mod tests;

pub use shapes::{find_credentials, redact_credentials};
pub use stream::StreamRedactor;

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

const B64_STD: &base64::alphabet::Alphabet = &base64::alphabet::STANDARD;
const B64_URL: &base64::alphabet::Alphabet = &base64::alphabet::URL_SAFE;

/// Base64 of `data` with `alphabet`, padded with `=` when `pad` (the
/// base64 crate's encoder: the workspace has no base64 of its own).
pub fn base64(data: &[u8], alphabet: &base64::alphabet::Alphabet, pad: bool) -> String {
    use base64::engine::{GeneralPurpose, GeneralPurposeConfig};
    use base64::Engine as _;
    GeneralPurpose::new(
        alphabet,
        GeneralPurposeConfig::new().with_encode_padding(pad),
    )
    .encode(data)
}

/// The base64 characters that depend only on `value` when it sits at byte
/// offset `shift` (0, 1 or 2) inside a longer base64-encoded stream.
fn base64_core(value: &[u8], shift: usize, alphabet: &base64::alphabet::Alphabet) -> String {
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
    /// string value, every object key (as [`Redactor::redact_str`]; a
    /// key that redacts to one already present replaces it) and every
    /// number, as its decimal text (a number holding a secret becomes the
    /// redacted text, a JSON string: a PIN or an account number sent as a
    /// number is still the secret), then matches
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
        self.redact_json_inexact(v, counts).0
    }

    /// [`Redactor::redact_json`] on a message parsed from `raw`, whose
    /// unchanged bytes would be forwarded: [`Redacted::Unchanged`] only
    /// when they may be. A number the parser could not hold exactly (past
    /// `u64`/`i64`, serde_json without `arbitrary_precision`: a 20-digit
    /// secret above 2^64 becomes an `f64` of 17 significant digits) has
    /// lost its text, so its digits cannot be checked in the value; they
    /// are still in `raw`. A message whose number literal of that kind
    /// holds a pattern is [`Redacted::Refused`]: forwarding the bytes
    /// would leak the secret, and re-serialising the rounded number its
    /// leading digits. (Turning on `arbitrary_precision` would keep every
    /// literal's text, but it changes `Number` for the whole workspace,
    /// the audit log's canonical JSON included; a secret in a number
    /// that long is rare enough to refuse.)
    pub fn redact_message(&self, v: &mut Value, raw: &[u8], counts: &mut [usize]) -> Redacted {
        if self.patterns.is_empty() {
            return Redacted::Unchanged;
        }
        let (changed, inexact) = self.redact_json_inexact(v, counts);
        // only then can a number's digits be missing from the value; the
        // search over `raw` is the candidates' (SIMD) one, and the scan of
        // its number literals runs only when it found something
        if inexact && self.occurs_in(raw) && number_literals(raw).any(|n| self.hidden_in(n)) {
            return Redacted::Refused;
        }
        if changed {
            Redacted::Changed
        } else {
            Redacted::Unchanged
        }
    }

    /// Whether the number literal `lit` holds a pattern the value parsed
    /// from it may not show. An integer that fits 64 bits is read as its
    /// very digits (the walk saw them); any other literal (a fraction, an
    /// exponent, an integer past 64 bits) became an `f64`, whose text is
    /// not the literal's, so a pattern in it is taken as hidden.
    fn hidden_in(&self, lit: &[u8]) -> bool {
        if !self.occurs_in(lit) {
            return false;
        }
        let exact = std::str::from_utf8(lit)
            .is_ok_and(|t| t.parse::<u64>().is_ok() || t.parse::<i64>().is_ok());
        !exact
    }

    /// `redact_json`, and whether a number of `v` is an `f64` (its wire
    /// text may have had more digits than the value keeps).
    fn redact_json_inexact(&self, v: &mut Value, counts: &mut [usize]) -> (bool, bool) {
        if self.patterns.is_empty() {
            return (false, false);
        }
        let mut walk = Walk::default();
        let mut changed = self.walk_redact(v, Place::Root, &mut walk, counts);
        let content_changed = walk.content;
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
        (changed, walk.inexact)
    }

    /// `walk_strings` of the relay with `redact_str`, tracking where in
    /// the message it is so that the content texts are known.
    fn walk_redact(&self, v: &mut Value, at: Place, walk: &mut Walk, counts: &mut [usize]) -> bool {
        match v {
            Value::Number(n) => {
                // its decimal text, as serde_json writes it (for an
                // integer, the very digits that came in), written on the
                // stack: a message of many numbers allocates nothing for
                // them (at most 20 digits and a sign, or an f64's shortest
                // form, under 32 bytes)
                walk.inexact |= n.is_f64();
                let mut buf = [0u8; 40];
                let mut cur = std::io::Cursor::new(&mut buf[..]);
                let written = std::io::Write::write_fmt(&mut cur, format_args!("{n}")).is_ok();
                let len = usize::try_from(cur.position()).unwrap_or(0);
                let heap;
                let text = match std::str::from_utf8(&buf[..len]) {
                    Ok(t) if written => t,
                    // never longer than the buffer; if it were, the heap
                    _ => {
                        heap = n.to_string();
                        heap.as_str()
                    }
                };
                let fixed = match self.redact_str(text, counts) {
                    Cow::Borrowed(_) => None,
                    Cow::Owned(o) => Some(o),
                };
                match fixed {
                    Some(o) => {
                        *v = Value::String(o);
                        true
                    }
                    None => false,
                }
            }
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
                    walk.content.push(changed);
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
                    changed |= self.walk_redact(x, inner, walk, counts);
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
                    changed |= self.walk_redact(x, inner, walk, counts);
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

/// The number literals of a JSON text, outside its strings, as they came
/// (a string's escapes skipped, so `"\"1234"` holds none).
fn number_literals(raw: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut i = 0;
    let mut in_string = false;
    std::iter::from_fn(move || {
        while i < raw.len() {
            let b = raw[i];
            if in_string {
                match b {
                    b'\\' => i += 1,
                    b'"' => in_string = false,
                    _ => {}
                }
                i += 1;
            } else if b == b'"' {
                in_string = true;
                i += 1;
            } else if b == b'-' || b.is_ascii_digit() {
                let start = i;
                while i < raw.len()
                    && matches!(raw[i], b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E')
                {
                    i += 1;
                }
                return Some(&raw[start..i]);
            } else {
                i += 1;
            }
        }
        None
    })
}

/// What [`Redactor::redact_message`] says of a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Redacted {
    /// Nothing to redact: the message's bytes may go as they came.
    Unchanged,
    /// The value was rewritten: serialise it.
    Changed,
    /// The bytes hold a secret in a number literal the value does not keep
    /// exactly (a fraction, an exponent, an integer past 64 bits): the
    /// message must not be forwarded in any form.
    Refused,
}

/// What [`Redactor::walk_redact`] learns on its way.
#[derive(Default)]
struct Walk {
    /// Whether each `/result/content` text (in order) was rewritten.
    content: Vec<bool>,
    /// Whether a number was read as an `f64`.
    inexact: bool,
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
/// relay's walk: [`Redactor::strip_cut_json`] and the session's result
/// screening use it.)
pub fn walk_strings(v: &mut Value, f: &mut dyn FnMut(&str) -> Option<String>) -> bool {
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
