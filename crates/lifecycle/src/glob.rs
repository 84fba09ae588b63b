//! Artifact patterns: a small glob matcher over `/`-separated paths
//! relative to `/workspace/output`.
//!
//! - a literal segment matches itself;
//! - `*` matches any run of characters within one segment (also none, and
//!   also a leading dot: a dotfile is not hidden from a pattern);
//! - `?` matches one character within a segment;
//! - `**`, as a whole segment, matches any number of segments (also none).
//!
//! There is no escaping, no character class and no brace: a policy that
//! needs them names the files. Matching is linear in the pattern times the
//! path (no backtracking blow-up on `**/**/**` or `*a*a*a`), since the path
//! comes from the sandbox and may be crafted.

/// Why a pattern is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("artifact pattern {pattern:?}: {reason}")]
pub struct PatternError {
    pub pattern: String,
    pub reason: &'static str,
}

/// Checks a pattern from the policy: relative, no `..` or `.` segment, no
/// empty segment (so no `//`, leading or trailing `/`), no NUL, and `**`
/// only as a whole segment.
pub fn check_pattern(pattern: &str) -> Result<(), PatternError> {
    let refuse = |reason| {
        Err(PatternError {
            pattern: pattern.to_string(),
            reason,
        })
    };
    if pattern.is_empty() {
        return refuse("an empty pattern");
    }
    if pattern.starts_with('/') {
        return refuse("an absolute pattern (patterns are relative to /workspace/output)");
    }
    if pattern.contains('\0') {
        return refuse("a NUL in a pattern");
    }
    for seg in pattern.split('/') {
        match seg {
            "" => return refuse("an empty segment"),
            "." => return refuse("a '.' segment"),
            ".." => return refuse("a '..' segment"),
            "**" => {}
            s if s.contains("**") => return refuse("'**' is only a whole segment"),
            _ => {}
        }
    }
    Ok(())
}

/// Whether `path` (relative, `/`-separated) matches `pattern`. A pattern
/// that [`check_pattern`] refuses matches nothing.
pub fn matches(pattern: &str, path: &str) -> bool {
    check_pattern(pattern).is_ok() && match_segments(pattern, path, false)
}

/// Whether some path below the directory `dir` could match `pattern`:
/// whether a walk has to look inside `dir`.
pub fn may_contain(pattern: &str, dir: &str) -> bool {
    check_pattern(pattern).is_ok() && match_segments(pattern, dir, true)
}

/// Dynamic programming over segments: `next[j]` is whether pattern
/// segments `i..` match path segments `j..`. With `prefix`, running out of
/// path while pattern remains is a (potential) match.
fn match_segments(pattern: &str, path: &str, prefix: bool) -> bool {
    let pat: Vec<&str> = pattern.split('/').collect();
    let segs: Vec<&str> = if path.is_empty() {
        Vec::new()
    } else {
        path.split('/').collect()
    };
    let n = segs.len();
    // row for i = pat.len(): only the empty rest of the path matches
    let mut next = vec![false; n + 1];
    next[n] = true;
    for i in (0..pat.len()).rev() {
        let mut row = vec![false; n + 1];
        row[n] = prefix || (pat[i] == "**" && next[n]);
        for j in (0..n).rev() {
            row[j] = if pat[i] == "**" {
                // none of the path here, or one segment and stay on `**`
                next[j] || row[j + 1]
            } else {
                match_segment(pat[i], segs[j]) && next[j + 1]
            };
        }
        next = row;
    }
    next[0]
}

/// `*` and `?` within one segment, by the two-pointer method with one
/// back-track point (linear for a single `*`, at most quadratic overall).
fn match_segment(pat: &str, name: &str) -> bool {
    let p: Vec<char> = pat.chars().collect();
    let s: Vec<char> = name.chars().collect();
    let (mut pi, mut si) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while si < s.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == s[si]) {
            pi += 1;
            si += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, si));
            pi += 1;
        } else if let Some((sp, ss)) = star {
            pi = sp + 1;
            si = ss + 1;
            star = Some((sp, ss + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literal_segments_match_only_themselves() {
        assert!(matches("report.pdf", "report.pdf"));
        assert!(!matches("report.pdf", "report.pdfx"));
        assert!(!matches("report.pdf", "a/report.pdf"));
        assert!(matches("a/b/c.txt", "a/b/c.txt"));
        assert!(!matches("a/b", "a/b/c"));
    }

    #[test]
    fn star_and_question_mark_stay_within_a_segment() {
        assert!(matches("*.txt", "a.txt"));
        assert!(matches("*.txt", ".txt"));
        assert!(matches("*.txt", ".hidden.txt"));
        assert!(!matches("*.txt", "dir/a.txt"));
        assert!(matches("a*b*c", "aXXbYYc"));
        assert!(matches("a*b*c", "abc"));
        assert!(!matches("a*b*c", "aXXbYY"));
        assert!(matches("?.log", "x.log"));
        assert!(!matches("?.log", "xy.log"));
        assert!(!matches("?", ""));
        assert!(matches("*", "anything"));
        assert!(!matches("*", "a/b"));
        assert!(matches("d*/*.csv", "data/x.csv"));
        assert!(matches("é?", "éü"));
    }

    #[test]
    fn double_star_spans_any_number_of_segments() {
        assert!(matches("**", "a"));
        assert!(matches("**", "a/b/c"));
        assert!(matches("**/*.pdf", "x.pdf"));
        assert!(matches("**/*.pdf", "a/b/x.pdf"));
        assert!(!matches("**/*.pdf", "a/b/x.pdf.txt"));
        assert!(matches("reports/**", "reports/2024/q1.csv"));
        assert!(matches("reports/**", "reports"));
        assert!(matches("a/**/z", "a/z"));
        assert!(matches("a/**/z", "a/b/c/z"));
        assert!(!matches("a/**/z", "a/b/c/zz"));
        assert!(matches("**/**/x", "x"));
    }

    #[test]
    fn may_contain_tells_a_walk_where_to_look() {
        assert!(may_contain("reports/*.csv", "reports"));
        assert!(!may_contain("reports/*.csv", "other"));
        assert!(!may_contain("reports/*.csv", "reports/sub"));
        assert!(may_contain("**/*.pdf", "a/b"));
        assert!(may_contain("a/**/z", "a/b/c"));
        assert!(!may_contain("a/**/z", "b"));
        assert!(may_contain("*", ""));
    }

    #[test]
    fn patterns_that_would_leave_output_are_refused() {
        for bad in [
            "",
            "/etc/passwd",
            "../x",
            "a/../b",
            "a/..",
            "./a",
            "a//b",
            "a/",
            "a/b/",
            "x**",
            "**x/y",
            "a\0b",
        ] {
            assert!(check_pattern(bad).is_err(), "{bad:?}");
            assert!(!matches(bad, "a"), "{bad:?}");
        }
        for good in ["*", "**", "a/**/b", "*.tar.gz", "r?port", ".hidden"] {
            assert!(check_pattern(good).is_ok(), "{good:?}");
        }
    }

    #[test]
    fn crafted_paths_do_not_blow_up_the_matcher() {
        let pat = "**/**/**/**/**/**/**/**/*a*a*a*a*a*a*a*a*b";
        let path = vec!["a".repeat(200); 60].join("/");
        assert!(!matches(pat, &path));
    }
}
