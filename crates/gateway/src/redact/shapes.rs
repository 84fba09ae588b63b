//! Credential-shaped strings: well-known token prefixes followed by runs of
//! their alphabet, and PEM private key blocks. Found by one automaton over
//! the prefixes (the few places a shape can start), then the rules.

use std::sync::OnceLock;

use aho_corasick::{AhoCorasick, MatchKind};
use mcpbox_policy::Reason;

/// A credential shape: a fixed prefix followed by a run of allowed
/// characters of a minimum (and optional maximum) length.
pub(super) struct Shape {
    /// Reason code for the audit log.
    pub(super) rule: Reason,
    pub(super) prefix: &'static str,
    pub(super) charset: fn(u8) -> bool,
    pub(super) min: usize,
    pub(super) max: usize,
}

fn alnum(b: u8) -> bool {
    b.is_ascii_alphanumeric()
}
pub(super) fn alnum_us(b: u8) -> bool {
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
pub(super) const SHAPES: &[Shape] = &[
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
