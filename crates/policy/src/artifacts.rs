//! `[artifacts] patterns`: which paths under /workspace/output a pattern names,
//! and which patterns are refused at load.
//!
//! A pattern is '/'-separated segments relative to /workspace/output. Within a
//! segment `*` matches any characters and `?` one; a segment that is exactly
//! `**` matches any number of segments (none included). Matching is iterative,
//! as for tool names, so a hostile path cannot make it blow up.

use crate::tools::glob_match;

/// Matches `pattern` against `path` (relative to /workspace/output, '/'-separated).
pub fn path_match(pattern: &str, path: &str) -> bool {
    let p: Vec<&str> = pattern.split('/').collect();
    let n: Vec<&str> = path.split('/').collect();
    let (mut pi, mut ni) = (0, 0);
    // the last `**` seen and the path segment it was tried at
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        match p.get(pi) {
            Some(&"**") => {
                star = Some((pi, ni));
                pi += 1;
            }
            Some(seg) if glob_match(seg, n[ni]) => {
                pi += 1;
                ni += 1;
            }
            _ => match star {
                // let the `**` take one more segment and retry
                Some((sp, sn)) => {
                    pi = sp + 1;
                    ni = sn + 1;
                    star = Some((sp, sn + 1));
                }
                None => return false,
            },
        }
    }
    p[pi..].iter().all(|s| *s == "**")
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
