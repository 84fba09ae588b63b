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
//! comes from the sandbox and may be crafted. The matcher is the policy
//! crate's (`mcpbox_policy::artifact_patterns`), so what the policy loader
//! accepts and what the export walk matches are one rule.

/// Why a pattern is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("artifact pattern {pattern:?}: {reason}")]
pub struct PatternError {
    pub pattern: String,
    pub reason: String,
}

/// Checks a pattern as the policy loader does (`mcpbox_policy`'s
/// checker: one rule for both): relative, no `..` or `.` segment, no empty
/// segment, no NUL, and `**` only as a whole segment.
pub fn check_pattern(pattern: &str) -> Result<(), PatternError> {
    mcpbox_policy::artifact_patterns::check(pattern).map_err(|(reason, _hint)| PatternError {
        pattern: pattern.to_string(),
        reason,
    })
}

/// Whether `path` (relative, `/`-separated) matches `pattern`. A pattern
/// that [`check_pattern`] refuses matches nothing.
pub fn matches(pattern: &str, path: &str) -> bool {
    mcpbox_policy::artifact_patterns::path_match(pattern, path)
}

/// Whether some path below the directory `dir` could match `pattern`:
/// whether a walk has to look inside `dir`.
pub fn may_contain(pattern: &str, dir: &str) -> bool {
    mcpbox_policy::artifact_patterns::may_contain(pattern, dir)
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
