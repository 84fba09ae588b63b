//! The one URL reader for decisions: the host and port of an http, https,
//! ws or wss URL, read strictly, so that what a rule is checked against is
//! the host every other URL parser would connect to. Argument rules
//! (`hosts`), the runners' registries (`npx --registry`, `--index-url`) and
//! `serve`'s remote upstreams read URLs here; `serve`'s config checker
//! gives its own messages first and ends with this check.
//!
//! Refused, because parsers disagree on them: whitespace, control
//! characters and backslashes anywhere (WHATWG reads `\` as `/`, so
//! `https://evil.test\@good.test` is evil.test to a browser or Node and
//! good.test to a reader that splits at `@`); user information
//! (`https://good.test@evil.test` names evil.test, and credentials do not
//! belong in a URL that ends up in logs); a host with characters outside
//! letters, digits, `.`, `-`, `_` (percent-escapes, IDN forms), an IPv6
//! literal that does not parse; a port that is not 1 to 65535 in digits.
//!
//! The other reader of hosts and ports is the egress proxy's
//! `mcpbox_egress::http::parse_authority`: it reads the authority form of a
//! request (`host:port`, no scheme) as a typed host, equally strict, and
//! also refuses host names a resolver would read as numbers.

/// `(host, port)` of `url`: the host as written (IPv6 in brackets, case
/// kept), the scheme's port when none is given. `Err` says why the URL is
/// refused.
pub fn host_port(url: &str) -> Result<(String, u16), String> {
    if url
        .chars()
        .any(|c| c.is_whitespace() || c.is_control() || c == '\\')
    {
        return Err("the URL has whitespace, control characters or a backslash".into());
    }
    let (scheme, rest) = url
        .split_once("://")
        .ok_or("the value is not a URL (scheme://host/...)")?;
    let default_port = match scheme.to_ascii_lowercase().as_str() {
        "http" | "ws" => 80,
        "https" | "wss" => 443,
        _ => return Err("the URL's scheme is not http, https, ws or wss".into()),
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    if authority.contains('@') {
        return Err("the URL carries user information (user@host)".into());
    }
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (ip, after) = v6
            .split_once(']')
            .ok_or("an unclosed [ in the URL's host")?;
        if ip.parse::<std::net::Ipv6Addr>().is_err() {
            return Err("the URL's host is not an IPv6 address in brackets".into());
        }
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':').ok_or("junk after the URL's [host]")?),
        };
        (format!("[{ip}]"), port)
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), Some(p)),
            None => (authority.to_string(), None),
        }
    };
    if host.is_empty() {
        return Err("the URL names no host".into());
    }
    let plain = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_');
    if !host.starts_with('[') && !host.bytes().all(plain) {
        return Err(
            "the URL's host has characters other than letters, digits, '.', '-', '_'".into(),
        );
    }
    let port = match port {
        // `host:` is the scheme's port (RFC 3986 §3.2.3)
        None | Some("") => default_port,
        Some(p) if p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()) => {
            match p.parse::<u16>() {
                Ok(0) | Err(_) => return Err("the URL's port is out of range".into()),
                Ok(n) => n,
            }
        }
        Some(_) => return Err("the URL's port is not a number".into()),
    };
    Ok((host, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_and_ports_are_read() {
        assert_eq!(
            host_port("https://A.b:8080/x").unwrap(),
            ("A.b".into(), 8080)
        );
        assert_eq!(host_port("http://[::1]/").unwrap(), ("[::1]".into(), 80));
        assert_eq!(host_port("http://[::1]:81").unwrap(), ("[::1]".into(), 81));
        assert_eq!(host_port("wss://h?x").unwrap(), ("h".into(), 443));
        assert_eq!(host_port("ws://h#f").unwrap(), ("h".into(), 80));
        assert_eq!(host_port("HTTPS://h:/").unwrap(), ("h".into(), 443));
        assert_eq!(
            host_port("http://reg_1.test:65535").unwrap(),
            ("reg_1.test".into(), 65535)
        );
    }

    #[test]
    fn what_parsers_read_differently_is_refused() {
        for url in [
            // user information: the host is after the last @
            "https://good.test@evil.test/",
            "https://u:p@good.test/",
            // a backslash: WHATWG reads it as '/', so this is evil.test there
            "https://evil.test\\@good.test/",
            "https://good.test\\x/",
            // whitespace and controls
            "https://h x/",
            "https://h\t/",
            "https://good.test\u{0}.evil.test/",
            // hosts outside the plain set
            "https://ex%61mple.test/",
            "https://bücher.test/",
            "https://[::1/",
            "https://[nothost]/",
            "https://[::1]x/",
            // ports
            "https://h:99999/",
            "https://h:0/",
            "https://h:+80/",
            "https://h:8o/",
            // no host, no scheme we read
            "https:///x",
            "https://:80/",
            "ftp://h/",
            "registry",
        ] {
            assert!(host_port(url).is_err(), "{url:?} was read");
        }
    }
}
