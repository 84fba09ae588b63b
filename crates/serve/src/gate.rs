//! The first checks of every HTTP face of mcpbox, in one place: the
//! gateway's (`crate::http`) and the web console's (`crate::console`)
//! call these and nothing else for them.
//!
//! - `Host` must name the server (DNS rebinding: a page on another site
//!   that resolves its own name to this address sends that name);
//! - `Origin`, when a browser sends it, must be one of the server's own;
//! - the token, as `Authorization: Bearer <token>` or (the console's page)
//!   a session cookie, is compared as a SHA-256 digest in constant time,
//!   so the time taken says nothing about how much of it matched.
//!
//! Header values are compared ASCII case-insensitively and without
//! surrounding blanks; an origin's trailing `/` is ignored.

use hyper::header::{HeaderMap, HeaderValue, AUTHORIZATION, COOKIE, HOST, ORIGIN};
use sha2::{Digest, Sha256};

/// The SHA-256 digest of a token, which is what is kept and compared.
pub fn digest(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

/// Compares two digests without an early exit: the time does not depend
/// on where they differ.
pub fn constant_time_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let mut diff = 0u8;
    for (x, y) in a.iter().zip(b.iter()) {
        diff |= x ^ y;
    }
    // black_box keeps the optimiser from turning the fold into an early exit
    std::hint::black_box(diff) == 0
}

/// Whether `presented` is the token whose digest is `expected`.
pub fn token_matches(expected: &[u8; 32], presented: &str) -> bool {
    constant_time_eq(expected, &digest(presented.as_bytes()))
}

fn normal(value: &str) -> String {
    value.trim().to_ascii_lowercase()
}

/// The request's `Host`, normalised, when it is one of `allowed` (each
/// lowercase already).
pub fn host<'a>(headers: &HeaderMap, allowed: &'a [String]) -> Option<&'a str> {
    let host = normal(headers.get(HOST)?.to_str().ok()?);
    allowed.iter().find(|h| **h == host).map(String::as_str)
}

/// Whether `host` (a `Host` header's value) is one of `allowed`.
pub fn host_allowed(allowed: &[String], host: &str) -> bool {
    let host = normal(host);
    allowed.contains(&host)
}

/// Whether `origin` (an `Origin` header's value) is one of `allowed`
/// (each lowercase, without a trailing `/`).
pub fn origin_allowed(allowed: &[String], origin: &str) -> bool {
    let origin = normal(origin);
    let origin = origin.trim_end_matches('/');
    allowed.iter().any(|o| o == origin)
}

/// The request's `Origin` check: `Ok` when it sends none or one of
/// `allowed`; `Err` with the value it sent otherwise.
pub fn origin<'h>(headers: &'h HeaderMap, allowed: &[String]) -> Result<(), &'h HeaderValue> {
    match headers.get(ORIGIN) {
        None => Ok(()),
        Some(o) if o.to_str().is_ok_and(|o| origin_allowed(allowed, o)) => Ok(()),
        Some(o) => Err(o),
    }
}

/// An `Authorization` header that is not `Bearer <token>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Malformed;

/// The bearer token of a request: `None` without an `Authorization`
/// header; [`Malformed`] for one that is not `Bearer <token>` (the scheme
/// in any case, the token not empty).
pub fn bearer(headers: &HeaderMap) -> Result<Option<&str>, Malformed> {
    let Some(v) = headers.get(AUTHORIZATION) else {
        return Ok(None);
    };
    let v = v.to_str().map_err(|_| Malformed)?;
    let (scheme, token) = v.split_once(' ').ok_or(Malformed)?;
    let token = token.trim();
    if !scheme.eq_ignore_ascii_case("bearer") || token.is_empty() {
        return Err(Malformed);
    }
    Ok(Some(token))
}

/// The values of cookie `name` the request carries (every `Cookie`
/// header, every pair).
pub fn cookies<'h>(headers: &'h HeaderMap, name: &'h str) -> impl Iterator<Item = &'h str> + 'h {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .filter(move |(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// Whether the request carries the token whose digest is `expected`: as
/// a bearer token, or (without an `Authorization` header) as the value of
/// cookie `cookie`. A malformed `Authorization` is no token, whatever the
/// cookies say.
pub fn has_token(headers: &HeaderMap, expected: &[u8; 32], cookie: Option<&str>) -> bool {
    match bearer(headers) {
        Ok(Some(t)) => token_matches(expected, t),
        Err(Malformed) => false,
        Ok(None) => {
            cookie.is_some_and(|name| cookies(headers, name).any(|v| token_matches(expected, v)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn host_and_origin_are_the_servers_own_only() {
        let hosts = vec!["127.0.0.1:8787".to_string(), "localhost:8787".to_string()];
        let origins = vec!["http://127.0.0.1:8787".to_string()];
        // (Host, accepted)
        for (h, ok) in [
            ("127.0.0.1:8787", true),
            ("LOCALHOST:8787", true),
            (" localhost:8787 ", true),
            ("evil.example:8787", false),
            ("127.0.0.1", false),
            ("127.0.0.1:8787.evil.example", false),
        ] {
            assert_eq!(host_allowed(&hosts, h), ok, "{h}");
            assert_eq!(host(&headers(&[("host", h)]), &hosts).is_some(), ok, "{h}");
        }
        assert_eq!(host(&HeaderMap::new(), &hosts), None);
        // (Origin, accepted)
        for (o, ok) in [
            ("http://127.0.0.1:8787", true),
            ("HTTP://127.0.0.1:8787/", true),
            ("https://127.0.0.1:8787", false),
            ("http://evil.example", false),
            ("null", false),
        ] {
            assert_eq!(origin_allowed(&origins, o), ok, "{o}");
            assert_eq!(
                origin(&headers(&[("origin", o)]), &origins).is_ok(),
                ok,
                "{o}"
            );
        }
        assert!(origin(&HeaderMap::new(), &origins).is_ok());
    }

    /// (headers, the bearer parse, whether the token is there with cookie "c")
    type Case<'a> = (
        &'a [(&'a str, &'a str)],
        Result<Option<&'a str>, Malformed>,
        bool,
    );

    #[test]
    fn the_token_is_a_bearer_or_else_the_cookie() {
        let d = digest(b"s3cret");
        let cases: [Case; 10] = [
            (&[], Ok(None), false),
            (
                &[("authorization", "Bearer s3cret")],
                Ok(Some("s3cret")),
                true,
            ),
            (
                &[("authorization", "bearer s3cret ")],
                Ok(Some("s3cret")),
                true,
            ),
            (
                &[("authorization", "Bearer wrong")],
                Ok(Some("wrong")),
                false,
            ),
            (&[("authorization", "Bearer ")], Err(Malformed), false),
            (
                &[("authorization", "Basic czNjcmV0")],
                Err(Malformed),
                false,
            ),
            (&[("cookie", "a=1; c=s3cret")], Ok(None), true),
            (
                &[("cookie", "c=wrong"), ("cookie", "c=s3cret")],
                Ok(None),
                true,
            ),
            (&[("cookie", "d=s3cret")], Ok(None), false),
            // a malformed Authorization is no token, whatever the cookie
            (
                &[("authorization", "Basic x"), ("cookie", "c=s3cret")],
                Err(Malformed),
                false,
            ),
        ];
        for (pairs, parsed, has) in cases {
            let h = headers(pairs);
            assert_eq!(bearer(&h), parsed, "{pairs:?}");
            assert_eq!(has_token(&h, &d, Some("c")), has, "{pairs:?}");
        }
        assert!(!has_token(&headers(&[("cookie", "c=s3cret")]), &d, None));
        assert!(token_matches(&d, "s3cret"));
        assert!(!token_matches(&d, "s3cre"));
    }
}
