//! Text from outside (a server, a host, a file name, a task name) made safe
//! for a terminal, a log line or a human's decision. One character set,
//! [`is_unsafe`]: the C0 and C1 controls and DEL (terminal escapes start
//! with them) and [`INVISIBLE`]'s invisible, bidirectional-control and tag
//! characters (text that reads differently from what it is: Trojan Source,
//! ASCII smuggling).
//!
//! Two strictnesses are meant, on that one set:
//! - [`escape`] writes each such character as an escape (`\x1b`,
//!   `\u{202e}`) and a backslash as `\\`: nothing is lost, the result
//!   reads back unambiguously. For what an operator must see exactly: names,
//!   paths, the arguments of a call waiting for approval.
//! - `mcpbox_gateway::screen::sanitize` removes them, and the whole escape
//!   sequence a control starts, keeping `\n` and `\t`: for a server's text
//!   on its way to the model or the user, where an escape would itself be
//!   noise. It reads [`INVISIBLE`] from here.
//!
//! Places that only need the set (drop, replace with `?`) call
//! [`is_unsafe`].

use std::borrow::Cow;
use std::fmt::Write as _;

/// Invisible and bidi-control code points that are removed. Each range with
/// why it is dangerous.
pub const INVISIBLE: &[(u32, u32)] = &[
    (0x00AD, 0x00AD),   // soft hyphen: invisible unless at a line break
    (0x034F, 0x034F),   // combining grapheme joiner: invisible
    (0x061C, 0x061C),   // arabic letter mark: bidi control
    (0x115F, 0x1160),   // hangul fillers: render as nothing
    (0x17B4, 0x17B5),   // khmer inherent vowels: invisible
    (0x180B, 0x180F),   // mongolian variation selectors / vowel separator
    (0x200B, 0x200F),   // zero-width space/joiners, LRM/RLM
    (0x2028, 0x2029),   // line/paragraph separators: hidden line breaks
    (0x202A, 0x202E),   // bidi embeddings and overrides (Trojan Source, CVE-2021-42574)
    (0x2060, 0x2064),   // word joiner, invisible operators
    (0x2066, 0x2069),   // bidi isolates (CVE-2021-42574)
    (0x206A, 0x206F),   // deprecated format characters
    (0x3164, 0x3164),   // hangul filler
    (0xFE00, 0xFE0F),   // variation selectors: used to smuggle bytes
    (0xFEFF, 0xFEFF),   // zero-width no-break space / BOM
    (0xFFA0, 0xFFA0),   // halfwidth hangul filler
    (0xFFF9, 0xFFFB),   // interlinear annotation controls
    (0x1D173, 0x1D17A), // musical formatting controls: invisible
    (0xE0000, 0xE007F), // tag characters: invisible ASCII ("ASCII smuggling")
    (0xE0100, 0xE01EF), // variation selectors supplement: byte smuggling
];

/// Whether `c` is in [`INVISIBLE`].
pub fn is_invisible(c: char) -> bool {
    let cp = u32::from(c);
    if cp < 0x00AD {
        return false;
    }
    INVISIBLE.iter().any(|&(lo, hi)| cp >= lo && cp <= hi)
}

/// Whether `c` must not reach a terminal as it is: a control character
/// (C0, DEL, C1; `\n` and `\t` included: callers that keep lines say so)
/// or an [`INVISIBLE`] one.
pub fn is_unsafe(c: char) -> bool {
    c.is_control() || is_invisible(c)
}

/// `s` with every [`is_unsafe`] character written as an escape: `\n`,
/// `\r`, `\t`, `\x1b` below U+0100, `\u{202e}` above; a backslash becomes
/// `\\` so the result reads back unambiguously. Borrows when there is
/// nothing to escape.
pub fn escape(s: &str) -> Cow<'_, str> {
    let needs = |c: char| c == '\\' || is_unsafe(c);
    if !s.chars().any(needs) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if is_unsafe(c) && u32::from(c) < 0x100 => {
                let _ = write!(out, "\\x{:02x}", u32::from(c));
            }
            c if is_unsafe(c) => {
                let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_set_is_controls_and_the_invisible_table() {
        for c in ['\u{0}', '\n', '\t', '\u{1b}', '\u{7f}', '\u{9b}'] {
            assert!(is_unsafe(c), "{c:?}");
        }
        for c in [
            '\u{ad}',
            '\u{200b}',
            '\u{200e}',
            '\u{2028}',
            '\u{202e}',
            '\u{2066}',
            '\u{feff}',
            '\u{e0041}',
            '\u{fe0f}',
        ] {
            assert!(is_unsafe(c) && is_invisible(c), "{c:?}");
        }
        for c in ['a', ' ', 'é', '中', '\u{a0}', '😀', '~'] {
            assert!(!is_unsafe(c), "{c:?}");
        }
    }

    #[test]
    fn escape_writes_controls_bidi_and_tags_as_escapes() {
        assert_eq!(escape("\u{1b}[31mred\n"), "\\x1b[31mred\\n");
        assert_eq!(escape("a\u{202e}b\\c"), "a\\u{202e}b\\\\c");
        // the line separator and tag characters the lifecycle's copy let through
        assert_eq!(escape("x\u{2028}y\u{e0041}"), "x\\u{2028}y\\u{e0041}");
        assert!(matches!(escape("plain name é"), Cow::Borrowed(_)));
    }

    #[test]
    fn the_invisible_table_is_sorted_and_disjoint() {
        for w in INVISIBLE.windows(2) {
            assert!(w[0].0 <= w[0].1 && w[0].1 < w[1].0, "{w:?}");
        }
    }
}
