//! Lexical confinement of a path argument to a root (the sandbox's workspace).
//!
//! A tool argument that names a file ("path", "uri") is checked before the call
//! goes on: it must resolve to the root or under it. This is the policy's part
//! only, done on the text: the caller resolves symlinks inside the sandbox,
//! where they point (a symlink in the workspace to `/etc` passes here).

/// Resolves `path` against `root` lexically and returns the normalised absolute
/// path when it is `root` or under it.
///
/// - a relative path is joined to `root`; an absolute one is taken as is;
/// - a `file://` URI (`file:///x`, `file://localhost/x`) stands for its path,
///   percent-decoded; a URI naming another host, or with a query or fragment,
///   is refused;
/// - empty, `.` and `..` segments are normalised (`..` at `/` stays at `/`,
///   as the kernel does);
/// - an empty path, a NUL byte (also a decoded `%00`) or a root that is not
///   absolute is refused.
///
/// Symlinks are not this function's job: `/workspace/link/x` passes even when
/// `link` points outside. The caller resolves the returned path inside the
/// sandbox (or opens it with `RESOLVE_BENEATH`) before trusting it.
///
/// The error is short and never echoes the path: it reaches the client.
pub fn confine_path(path: &str, root: &str) -> Result<String, String> {
    if path.is_empty() {
        return Err("empty path".into());
    }
    if path.contains('\0') {
        return Err("path contains a NUL byte".into());
    }
    if !root.starts_with('/') || root.contains('\0') {
        return Err("the root is not an absolute path".into());
    }
    let decoded;
    let path = match strip_file_scheme(path) {
        Some(rest) => {
            decoded = file_uri_path(rest)?;
            decoded.as_str()
        }
        None => path,
    };
    let root_parts = normalise(&[], root);
    let parts = if path.starts_with('/') {
        normalise(&[], path)
    } else {
        normalise(&root_parts, path)
    };
    // segment-wise prefix: `/workspacex` is not under `/workspace`
    if parts.len() < root_parts.len() || parts[..root_parts.len()] != root_parts[..] {
        return Err(format!("path is outside {}", join(&root_parts)));
    }
    Ok(join(&parts))
}

/// The host directories behind the sandbox's directories, for the paths a
/// host knows: a client offers `file:///home/u/proj` as a root, or names
/// `/home/u/proj/src/a.rs` in an argument, where the server sees
/// `/workspace/input`. Matching is on the text, segment-wise: a host path
/// reached through a symlink of the host's is not translated (and then
/// counts as outside).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PathMap {
    /// (host directory, sandbox directory), normalised, longest host first.
    pairs: Vec<(String, String)>,
}

impl PathMap {
    /// A map from (host directory, sandbox directory) pairs; relative
    /// paths are ignored.
    pub fn new<I, H, S>(pairs: I) -> PathMap
    where
        I: IntoIterator<Item = (H, S)>,
        H: AsRef<str>,
        S: AsRef<str>,
    {
        let mut pairs: Vec<(String, String)> = pairs
            .into_iter()
            .filter(|(h, s)| h.as_ref().starts_with('/') && s.as_ref().starts_with('/'))
            .map(|(h, s)| (normalise_abs(h.as_ref()), normalise_abs(s.as_ref())))
            .collect();
        pairs.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.cmp(b)));
        PathMap { pairs }
    }

    /// The sandbox directories, in no particular order.
    pub fn sandbox_dirs(&self) -> impl Iterator<Item = &str> {
        self.pairs.iter().map(|(_, s)| s.as_str())
    }

    /// The sandbox path of an absolute host path, if a mapped host
    /// directory holds it.
    pub fn to_sandbox(&self, host_path: &str) -> Option<String> {
        if !host_path.starts_with('/') || host_path.contains('\0') {
            return None;
        }
        let norm = normalise_abs(host_path);
        self.pairs.iter().find_map(|(h, s)| {
            let rest = if norm == *h {
                ""
            } else if h == "/" {
                &norm[..]
            } else {
                norm.strip_prefix(h.as_str())
                    .filter(|r| r.starts_with('/'))?
            };
            Some(if rest.is_empty() {
                s.clone()
            } else if s == "/" {
                rest.to_string()
            } else {
                format!("{s}{rest}")
            })
        })
    }

    /// A root a client offers, as the server may see it: a `file://` URI
    /// already under /workspace or a mapped sandbox directory as it is
    /// (normalised), one under a mapped host directory as its sandbox
    /// path; anything else None (dropped).
    pub fn root_uri(&self, uri: &str) -> Option<String> {
        let path = file_uri_path(strip_file_scheme(uri)?).ok()?;
        if !path.starts_with('/') {
            return None;
        }
        let norm = normalise_abs(&path);
        let inside =
            |d: &str| norm == d || norm.strip_prefix(d).is_some_and(|r| r.starts_with('/'));
        if inside("/workspace") || self.sandbox_dirs().any(|d| d != "/" && inside(d)) {
            return Some(format!("file://{}", percent_encode_path(&norm)));
        }
        self.uri_to_sandbox(uri)
    }

    /// A `file://` URI of a host path as the URI of its sandbox path.
    pub fn uri_to_sandbox(&self, uri: &str) -> Option<String> {
        let path = file_uri_path(strip_file_scheme(uri)?).ok()?;
        self.to_sandbox(&path)
            .map(|p| format!("file://{}", percent_encode_path(&p)))
    }
}

/// `%XX` for every byte of `p` but unreserved characters and `/`.
fn percent_encode_path(p: &str) -> String {
    let mut out = String::with_capacity(p.len());
    for b in p.bytes() {
        if b.is_ascii_alphanumeric() || b"/-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The rest of `s` after a case-insensitive `file://`.
pub(crate) fn strip_file_scheme(s: &str) -> Option<&str> {
    let head = s.get(..7)?;
    if head.eq_ignore_ascii_case("file://") {
        s.get(7..)
    } else {
        None
    }
}

/// The path of a `file://` URI (what follows the scheme), percent-decoded.
pub(crate) fn file_uri_path(rest: &str) -> Result<String, String> {
    if rest.contains(['?', '#']) {
        return Err("a file URI with a query or fragment is not a path".into());
    }
    // RFC 8089: `file:///p` (empty authority) or `file://localhost/p`
    let path = match rest.find('/') {
        Some(0) => rest,
        Some(at) if rest[..at].eq_ignore_ascii_case("localhost") => &rest[at..],
        _ => return Err("a file URI must name a local path (file:///...)".into()),
    };
    let decoded = percent_decode(path)?;
    if decoded.contains('\0') {
        return Err("path contains a NUL byte".into());
    }
    Ok(decoded)
}

/// Decodes `%XX` escapes; a malformed escape or a result that is not UTF-8 is an error.
fn percent_decode(s: &str) -> Result<String, String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = |b: u8| (b as char).to_digit(16);
            let hi = bytes.get(i + 1).copied().and_then(hex);
            let lo = bytes.get(i + 2).copied().and_then(hex);
            match (hi, lo) {
                (Some(hi), Some(lo)) => {
                    // two hex digits: at most 0xff, so the cast is exact
                    out.push((hi * 16 + lo) as u8);
                    i += 3;
                }
                _ => return Err("malformed percent escape in a file URI".into()),
            }
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| "a file URI that does not decode to UTF-8".to_string())
}

/// The segments of `path` appended to `base`, with `.`, `..` and empty segments resolved.
fn normalise(base: &[String], path: &str) -> Vec<String> {
    let mut parts: Vec<String> = base.to_vec();
    for seg in path.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            other => parts.push(other.to_string()),
        }
    }
    parts
}

/// An absolute path with `.`, `..` and empty segments resolved on the text.
pub(crate) fn normalise_abs(path: &str) -> String {
    join(&normalise(&[], path))
}

fn join(parts: &[String]) -> String {
    if parts.is_empty() {
        return "/".into();
    }
    let mut out = String::new();
    for p in parts {
        out.push('/');
        out.push_str(p);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_paths_map_to_the_sandbox_segment_wise() {
        let m = PathMap::new([
            ("/home/u/proj", "/workspace/input"),
            ("/home/u/proj/out", "/workspace/output"),
            ("/srv/data/", "/data"),
        ]);
        assert_eq!(m.to_sandbox("/home/u/proj").unwrap(), "/workspace/input");
        assert_eq!(
            m.to_sandbox("/home/u/proj/src/a.rs").unwrap(),
            "/workspace/input/src/a.rs"
        );
        // the longest host directory wins
        assert_eq!(
            m.to_sandbox("/home/u/proj/out/r.md").unwrap(),
            "/workspace/output/r.md"
        );
        assert_eq!(m.to_sandbox("/srv/data/x").unwrap(), "/data/x");
        assert!(m.to_sandbox("/home/u/projx").is_none());
        assert!(m.to_sandbox("/home/u/proj/../.ssh").is_none());
        assert!(m.to_sandbox("relative").is_none());
        assert_eq!(
            m.uri_to_sandbox("file:///home/u/proj/a%20b").unwrap(),
            "file:///workspace/input/a%20b"
        );
        assert!(m.uri_to_sandbox("file:///etc").is_none());
        assert!(m.uri_to_sandbox("https://x/home/u/proj").is_none());
        // a root already in the sandbox stays; one outside everything goes
        assert_eq!(
            m.root_uri("file:///workspace/input/").unwrap(),
            "file:///workspace/input"
        );
        assert_eq!(m.root_uri("file:///data/x").unwrap(), "file:///data/x");
        assert_eq!(
            m.root_uri("file:///home/u/proj/src").unwrap(),
            "file:///workspace/input/src"
        );
        assert!(m.root_uri("file:///home/u").is_none());
        assert!(m.root_uri("file:///workspace/../etc").is_none());
        assert!(m.root_uri("not a uri").is_none());
    }

    const ROOT: &str = "/workspace";

    #[test]
    fn relative_and_absolute_paths_under_the_root_are_normalised() {
        assert_eq!(confine_path("a/b", ROOT).unwrap(), "/workspace/a/b");
        assert_eq!(confine_path("./a//b/.", ROOT).unwrap(), "/workspace/a/b");
        assert_eq!(confine_path("a/../b", ROOT).unwrap(), "/workspace/b");
        assert_eq!(confine_path(".", ROOT).unwrap(), "/workspace");
        assert_eq!(confine_path("/workspace", ROOT).unwrap(), "/workspace");
        assert_eq!(confine_path("/workspace/", ROOT).unwrap(), "/workspace");
        assert_eq!(
            confine_path("/workspace/output/r.md", ROOT).unwrap(),
            "/workspace/output/r.md"
        );
        assert_eq!(confine_path("x", "/workspace/").unwrap(), "/workspace/x");
        assert_eq!(confine_path("/etc", "/").unwrap(), "/etc");
    }

    #[test]
    fn dotdot_out_of_the_root_is_refused() {
        assert!(confine_path("/workspace/../etc", ROOT).is_err());
        assert!(confine_path("a/../../x", ROOT).is_err());
        assert!(confine_path("..", ROOT).is_err());
        assert!(confine_path("../workspace2/x", ROOT).is_err());
        // `..` at `/` stays at `/`, so this climbs back in
        assert_eq!(
            confine_path("/../../workspace/a", ROOT).unwrap(),
            "/workspace/a"
        );
    }

    #[test]
    fn sibling_with_the_root_as_a_string_prefix_is_refused() {
        let e = confine_path("/workspacex/a", ROOT).unwrap_err();
        assert_eq!(e, "path is outside /workspace");
        assert!(confine_path("/work", ROOT).is_err());
        assert!(confine_path("/etc/passwd", ROOT).is_err());
    }

    #[test]
    fn file_uris_are_decoded_and_confined() {
        assert_eq!(
            confine_path("file:///workspace/a%20b.txt", ROOT).unwrap(),
            "/workspace/a b.txt"
        );
        assert_eq!(
            confine_path("FILE://localhost/workspace/x", ROOT).unwrap(),
            "/workspace/x"
        );
        // an encoded `..` is still a `..`
        assert!(confine_path("file:///workspace/%2e%2e/etc/passwd", ROOT).is_err());
        assert!(confine_path("file:///workspace/%2E%2E%2Fetc", ROOT).is_err());
        assert!(confine_path("file://evil.example/workspace/x", ROOT).is_err());
        assert!(confine_path("file://", ROOT).is_err());
        assert!(confine_path("file:///workspace/x?y", ROOT).is_err());
        assert!(confine_path("file:///workspace/x#y", ROOT).is_err());
        assert!(confine_path("file:///workspace/%zz", ROOT).is_err());
        assert!(confine_path("file:///workspace/%ff", ROOT).is_err());
        assert!(confine_path("file:///workspace/%", ROOT).is_err());
    }

    #[test]
    fn nul_bytes_and_empty_paths_are_refused() {
        assert_eq!(confine_path("", ROOT).unwrap_err(), "empty path");
        assert!(confine_path("a\0b", ROOT).is_err());
        assert!(confine_path("file:///workspace/a%00b", ROOT).is_err());
        assert!(confine_path("a", "workspace").is_err());
        assert!(confine_path("a", "").is_err());
    }

    #[test]
    fn errors_do_not_echo_the_path() {
        let long = format!("/etc/{}", "x".repeat(500));
        let e = confine_path(&long, ROOT).unwrap_err();
        assert!(e.len() < 80, "{e}");
    }
}
