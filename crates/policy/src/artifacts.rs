//! `[artifacts] patterns`: which paths under /workspace/output a pattern names,
//! and which patterns are refused at load.
//!
//! A pattern is '/'-separated segments relative to /workspace/output. Within a
//! segment `*` matches any characters and `?` one; a segment that is exactly
//! `**` matches any number of segments (none included). Matching is linear in
//! the pattern times the path (dynamic programming over segments, one
//! back-track point within a segment), so a hostile path cannot make it blow
//! up. The one matcher of artifact patterns: the lifecycle's export walk uses
//! it too (`mcpbox_lifecycle::glob`). Within a segment it is the tool-name
//! glob, [`crate::tools::glob_match`]: one `*`/`?` matcher in the workspace.

use crate::tools::glob_match;

/// Matches `pattern` against `path` (relative to /workspace/output,
/// '/'-separated). A pattern [`check`] refuses matches nothing.
pub fn path_match(pattern: &str, path: &str) -> bool {
    check_pattern(pattern).is_none() && match_segments(pattern, path, false)
}

/// Whether some path below the directory `dir` could match `pattern`:
/// whether a walk of the output has to look inside `dir`.
pub fn may_contain(pattern: &str, dir: &str) -> bool {
    check_pattern(pattern).is_none() && match_segments(pattern, dir, true)
}

/// Checks a pattern as the policy loader does: `Err((message, hint))` for
/// one that is refused.
pub fn check(pattern: &str) -> Result<(), (String, &'static str)> {
    match check_pattern(pattern) {
        None => Ok(()),
        Some(problem) => Err(problem),
    }
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
                glob_match(pat[i], segs[j]) && next[j + 1]
            };
        }
        next = row;
    }
    next[0]
}

/// Why a pattern is refused, as (message, hint); `None` when it is valid.
pub(crate) fn check_pattern(pattern: &str) -> Option<(String, &'static str)> {
    let shown = pattern.escape_debug();
    const HINT: &str = "write a pattern relative to /workspace/output, e.g. \"report.md\", \"*.csv\" or \"dist/**\"";
    if pattern.contains('\0') {
        return Some(("pattern contains a NUL character".into(), HINT));
    }
    if pattern.is_empty() {
        return Some(("empty pattern".into(), HINT));
    }
    if pattern.starts_with('/') {
        return Some((
            format!("\"{shown}\" is absolute"),
            "patterns are relative to /workspace/output: write \"report.md\" for /workspace/output/report.md",
        ));
    }
    for seg in pattern.split('/') {
        let problem = match seg {
            "" => "an empty segment (\"//\" or a trailing '/')",
            ".." => "a \"..\" segment, which would name a file outside /workspace/output",
            "." => "a \".\" segment, which no exported path has",
            s if s != "**" && s.contains("**") => "\"**\" inside a segment",
            _ => continue,
        };
        return Some((
            format!("\"{shown}\" has {problem}"),
            "write segments separated by single '/', without \".\" or \"..\"; \"**\" stands alone between slashes, e.g. \"dist/**/*.js\"",
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn star_stays_within_a_segment_and_double_star_crosses_them() {
        assert!(path_match("report.md", "report.md"));
        assert!(!path_match("report.md", "sub/report.md"));
        assert!(path_match("*.csv", "a.csv"));
        assert!(!path_match("*.csv", "sub/a.csv"));
        assert!(path_match("dist/**", "dist/a.js"));
        assert!(path_match("dist/**", "dist/x/y/z.js"));
        assert!(!path_match("dist/**", "distx/a.js"));
        assert!(path_match("**/*.md", "a.md"));
        assert!(path_match("**/*.md", "a/b/c.md"));
        assert!(path_match("a/**/b", "a/b"));
        assert!(path_match("a/**/b", "a/x/y/b"));
        assert!(!path_match("a/**/b", "a/x/y/c"));
        assert!(path_match("r?port.md", "report.md"));
        assert!(!path_match("r?port.md", "rport.md"));
    }

    #[test]
    fn hostile_paths_do_not_blow_up() {
        let path = vec!["a"; 2000].join("/") + "/b";
        assert!(!path_match("**/a/**/a/**/a/**/c", &path));
        assert!(path_match("**/a/**/b", &path));
    }

    #[test]
    fn escaping_and_malformed_patterns_are_refused() {
        for bad in [
            "",
            "/etc/passwd",
            "../x",
            "a/../../x",
            "a//b",
            "dist/",
            "./a",
            "a**",
            "\0",
        ] {
            assert!(check_pattern(bad).is_some(), "{bad:?} should be refused");
        }
        for good in ["report.md", "dist/**", "**", "**/*.md", ".hidden", "a..b"] {
            assert_eq!(check_pattern(good), None, "{good:?}");
        }
    }
}
