//! `[network]`: host patterns, their validation and the egress decision engine.
//!
//! The engine answers "may the sandbox connect to HOST:PORT" from the policy
//! alone. What a name resolves to (private, loopback, metadata addresses) is
//! the egress proxy's check, made after resolution; it is not repeated here.

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::decision::{Decision, Reason, Source, Verdict};
use crate::{with_sub_key, HINT_MARK};

/// Hint shown for a malformed host pattern.
pub(crate) const PATTERN_HINT: &str = "write a host name (\"api.github.com\"), a subdomain wildcard (\"*.example.com\"), an IP literal (\"10.1.2.3\", \"[::1]\") or a CIDR (\"10.0.0.0/8\"), each optionally followed by \":PORT\"; internationalized names in punycode (xn--...)";

/// What a host pattern matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostPattern {
    /// One exact host name (lowercase, no trailing dot).
    Name(String),
    /// Every proper subdomain of this suffix (`*.example.com` -> `example.com`), not the apex.
    Subdomains(String),
    /// One IP address.
    Ip(IpAddr),
    /// An IP network: address and prefix length.
    Cidr(IpAddr, u8),
}

/// One entry of `network.allow` or `network.deny`, parsed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct HostRule {
    /// What hosts it matches.
    pub pattern: HostPattern,
    /// The port it is limited to; `None` means the web ports 80 and 443 in
    /// `allow`, and every port in `deny` (a deny reads as absolute).
    pub port: Option<u16>,
    text: String,
}

impl JsonSchema for HostRule {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "HostPattern".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "description": "a host name (\"api.github.com\"), a subdomain wildcard (\"*.example.com\": subdomains only, not the apex), an IP literal or CIDR (\"10.0.0.0/8\", \"[::1]\"), optionally with \":PORT\" (default ports 80 and 443)"
        })
    }
}

impl From<HostRule> for String {
    fn from(r: HostRule) -> String {
        r.text
    }
}

impl TryFrom<String> for HostRule {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        HostRule::parse(&s).map_err(|m| format!("{m}{HINT_MARK}{PATTERN_HINT}"))
    }
}

impl fmt::Display for HostRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

fn parse_port(s: &str, whole: &str) -> Result<u16, String> {
    if s.is_empty() || !s.chars().all(|c| c.is_ascii_digit()) {
        return Err(format!("invalid port in \"{}\"", whole.escape_debug()));
    }
    match s.parse::<u16>() {
        Ok(0) => Err(format!(
            "port 0 in \"{}\" is not a port",
            whole.escape_debug()
        )),
        Ok(p) => Ok(p),
        Err(_) => Err(format!(
            "port in \"{}\" is above 65535",
            whole.escape_debug()
        )),
    }
}

fn parse_cidr(s: &str, whole: &str) -> Result<HostPattern, String> {
    let bad = || format!("invalid CIDR \"{}\"", whole.escape_debug());
    let (addr, len) = s.split_once('/').ok_or_else(bad)?;
    let addr: IpAddr = addr.parse().map_err(|_| bad())?;
    if len.is_empty() || !len.chars().all(|c| c.is_ascii_digit()) || len.len() > 3 {
        return Err(bad());
    }
    let len: u8 = len.parse().map_err(|_| bad())?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    if len > max {
        return Err(format!(
            "prefix length /{len} in \"{}\" is longer than {max}",
            whole.escape_debug()
        ));
    }
    if len == 0 {
        return Err(format!(
            "\"{}\" matches every address",
            whole.escape_debug()
        ));
    }
    let addr = canonical_ip(addr);
    if network_of(addr, len) != addr {
        return Err(format!(
            "\"{}\" has host bits set; the network is {}/{len}",
            whole.escape_debug(),
            network_of(addr, len)
        ));
    }
    Ok(HostPattern::Cidr(addr, len))
}

/// Maps an IPv4-mapped IPv6 address (`::ffff:10.0.0.1`) to its IPv4 form,
/// so that one address has one spelling for matching.
pub(crate) fn canonical_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        v4 => v4,
    }
}

fn network_of(ip: IpAddr, len: u8) -> IpAddr {
    match ip {
        IpAddr::V4(a) => {
            let bits = u32::from(a);
            let mask = if len == 0 {
                0
            } else {
                u32::MAX << (32 - u32::from(len.min(32)))
            };
            IpAddr::V4(Ipv4Addr::from(bits & mask))
        }
        IpAddr::V6(a) => {
            let bits = u128::from(a);
            let mask = if len == 0 {
                0
            } else {
                u128::MAX << (128 - u32::from(len.min(128)))
            };
            IpAddr::V6(Ipv6Addr::from(bits & mask))
        }
    }
}

/// Checks one DNS label (lowercase already).
fn valid_label(label: &str) -> bool {
    !label.is_empty()
        && label.len() <= 63
        && label
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
        && !label.starts_with('-')
        && !label.ends_with('-')
}

/// Normalizes and checks a host name: lowercase, trailing dot removed, labels valid.
pub(crate) fn normalize_name(name: &str) -> Option<String> {
    let lower = name.to_ascii_lowercase();
    let trimmed = lower.strip_suffix('.').unwrap_or(&lower);
    if trimmed.is_empty() || trimmed.len() > 253 || !trimmed.split('.').all(valid_label) {
        return None;
    }
    // all-numeric dotted names look like (broken) IPv4 literals: refuse the ambiguity
    if trimmed.chars().all(|c| c.is_ascii_digit() || c == '.') {
        return None;
    }
    Some(trimmed.to_string())
}

impl HostRule {
    /// Parses one pattern as written in the policy.
    pub fn parse(text: &str) -> Result<HostRule, String> {
        let whole = text;
        if text.is_empty() {
            return Err("empty host pattern".into());
        }
        if text.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(format!(
                "host pattern \"{}\" contains whitespace",
                text.escape_debug()
            ));
        }
        if text.contains("://") || text.contains('@') || text.contains('?') || text.contains('#') {
            return Err(format!(
                "\"{}\" is a URL, not a host pattern",
                text.escape_debug()
            ));
        }
        let (pattern, port) = if let Some(rest) = text.strip_prefix('[') {
            let (inner, after) = rest
                .split_once(']')
                .ok_or_else(|| format!("missing \"]\" in \"{}\"", whole.escape_debug()))?;
            let port = match after {
                "" => None,
                p => Some(parse_port(
                    p.strip_prefix(':').ok_or_else(|| {
                        format!("unexpected \"{}\" after \"]\"", p.escape_debug())
                    })?,
                    whole,
                )?),
            };
            let pattern = if inner.contains('/') {
                parse_cidr(inner, whole)?
            } else {
                let ip: Ipv6Addr = inner
                    .parse()
                    .map_err(|_| format!("invalid IPv6 address \"{}\"", inner.escape_debug()))?;
                HostPattern::Ip(canonical_ip(IpAddr::V6(ip)))
            };
            (pattern, port)
        } else if text.matches(':').count() > 1 {
            // a bare IPv6 literal or CIDR: no port possible without brackets
            let pattern = if text.contains('/') {
                parse_cidr(text, whole)?
            } else {
                let ip: Ipv6Addr = text.parse().map_err(|_| {
                    format!(
                        "invalid IPv6 address \"{}\" (write \"[ADDR]:PORT\" for a port)",
                        text.escape_debug()
                    )
                })?;
                HostPattern::Ip(canonical_ip(IpAddr::V6(ip)))
            };
            (pattern, None)
        } else {
            let (host, port) = match text.rsplit_once(':') {
                Some((h, p)) => (h, Some(parse_port(p, whole)?)),
                None => (text, None),
            };
            let pattern = if host.contains('/') {
                parse_cidr(host, whole)?
            } else if let Ok(ip) = host.parse::<Ipv4Addr>() {
                HostPattern::Ip(IpAddr::V4(ip))
            } else if host == "*" || host == "*." {
                return Err(format!("\"{}\" matches every host", whole.escape_debug()));
            } else if let Some(suffix) = host.strip_prefix("*.") {
                if suffix.contains('*') {
                    return Err(format!(
                        "\"{}\" matches every host under a wildcard; only one leading \"*.\" is allowed",
                        whole.escape_debug()
                    ));
                }
                let suffix = normalize_name(suffix)
                    .ok_or_else(|| format!("invalid host name in \"{}\"", whole.escape_debug()))?;
                if !suffix.contains('.') {
                    return Err(format!(
                        "\"{}\" matches a whole top-level domain; name at least two labels, e.g. \"*.example.{suffix}\"",
                        whole.escape_debug()
                    ));
                }
                HostPattern::Subdomains(suffix)
            } else if host.contains('*') {
                return Err(format!(
                    "\"{}\": a wildcard is only allowed as the leftmost label, as in \"*.example.com\"",
                    whole.escape_debug()
                ));
            } else {
                HostPattern::Name(
                    normalize_name(host)
                        .ok_or_else(|| format!("invalid host name \"{}\"", host.escape_debug()))?,
                )
            };
            (pattern, port)
        };
        Ok(HostRule {
            pattern,
            port,
            text: text.to_string(),
        })
    }

    /// A normalized spelling, equal for two rules that match the same hosts and ports.
    pub fn canonical(&self) -> String {
        let host = match &self.pattern {
            HostPattern::Name(n) => n.clone(),
            HostPattern::Subdomains(s) => format!("*.{s}"),
            HostPattern::Ip(ip) => ip.to_string(),
            HostPattern::Cidr(ip, len) => format!("{ip}/{len}"),
        };
        match self.port {
            Some(p) => format!("{host} port {p}"),
            None => format!("{host} ports 80,443"),
        }
    }

    /// Whether it covers `host:port` as an `allow` rule does (no port: 80
    /// and 443); a host that is not a valid name or IP literal never matches.
    pub fn covers(&self, host: &str, port: u16) -> bool {
        normalize_host(host).is_some_and(|h| self.matches(&h, port, false))
    }

    /// Whether it covers `host:port`; `any_port` makes a rule without a
    /// port cover every port (a `deny` rule), else only 80 and 443.
    fn matches(&self, host: &Host, port: u16, any_port: bool) -> bool {
        let port_ok = match self.port {
            Some(p) => p == port,
            None => any_port || port == 80 || port == 443,
        };
        if !port_ok {
            return false;
        }
        match (&self.pattern, host) {
            (HostPattern::Name(n), Host::Name(h)) => n == h,
            (HostPattern::Subdomains(s), Host::Name(h)) => {
                h.len() > s.len() + 1
                    && h.ends_with(s.as_str())
                    && h.as_bytes()[h.len() - s.len() - 1] == b'.'
            }
            (HostPattern::Ip(ip), Host::Ip(h)) => ip == h,
            (HostPattern::Cidr(net, len), Host::Ip(h)) => {
                net.is_ipv4() == h.is_ipv4() && network_of(*h, *len) == *net
            }
            // a name rule never matches an IP literal, nor an IP rule a name
            _ => false,
        }
    }
}

/// Deserializes a list of host patterns, naming the element that is wrong
/// (toml reports element errors with the span of the whole array).
fn host_rules<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<HostRule>, D::Error> {
    struct ListVisitor;
    impl<'de> serde::de::Visitor<'de> for ListVisitor {
        type Value = Vec<HostRule>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a list of host patterns like [\"api.github.com\", \"*.example.com\"]")
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(
            self,
            mut seq: A,
        ) -> Result<Vec<HostRule>, A::Error> {
            use serde::de::Error;
            let mut out = Vec::new();
            loop {
                let i = out.len();
                let sub =
                    |m: &dyn fmt::Display| A::Error::custom(with_sub_key(&format!("[{i}]"), m));
                let item = match seq.next_element::<String>() {
                    Ok(Some(s)) => s,
                    Ok(None) => return Ok(out),
                    Err(e) => return Err(sub(&e)),
                };
                match HostRule::try_from(item) {
                    Ok(rule) => out.push(rule),
                    Err(m) => return Err(sub(&m)),
                }
            }
        }
    }
    d.deserialize_seq(ListVisitor)
}

/// A host as asked for by a client, normalized.
enum Host {
    Name(String),
    Ip(IpAddr),
}

fn normalize_host(host: &str) -> Option<Host> {
    let inner = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if let Ok(ip) = inner.parse::<IpAddr>() {
        return Some(Host::Ip(canonical_ip(ip)));
    }
    if inner != host {
        return None;
    }
    normalize_name(host).map(Host::Name)
}

/// What to do with a connection to a host that no rule lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Unlisted {
    /// Refuse it (the default).
    #[default]
    Deny,
    /// Hold it while a human is asked.
    Approve,
}

/// The `[network]` section: which hosts the sandbox may reach through the egress proxy.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NetworkRules {
    /// Hosts the sandbox may connect to: names ("api.github.com"), subdomain wildcards
    /// ("*.example.com", not the apex), IP literals and CIDRs, each optionally with ":PORT"
    /// (default ports 80 and 443). Empty (the default): no egress at all.
    #[serde(default, deserialize_with = "host_rules")]
    pub allow: Vec<HostRule>,
    /// Hosts that are always refused, in the same syntax; deny wins over allow.
    #[serde(default, deserialize_with = "host_rules")]
    pub deny: Vec<HostRule>,
    /// What happens to a host that neither list names: "deny" (default) or "approve" (ask a human).
    #[serde(default)]
    pub unlisted: Unlisted,
    /// Explicit name -> IP address mappings, the deliberate exception for an internal
    /// service: the proxy connects to this address without resolving the name and without
    /// its private-address refusal. A mapping does not allow the name: list it in `allow` too.
    #[serde(default)]
    pub hosts: BTreeMap<String, IpAddr>,
    /// Services on the machine mcpbox runs on that the sandbox may reach: each
    /// `"localhost:PORT"` (or `"127.0.0.1:PORT"`, `"[::1]:PORT"`), a port on the host's
    /// own loopback. Inside the sandbox, loopback is the sandbox's own; a request
    /// through the proxy for a loopback host on a listed port is connected to the
    /// host's loopback on that port, and on any other port refused (reason
    /// `network.local_unlisted`) without asking anyone.
    #[serde(default, deserialize_with = "host_rules")]
    pub local: Vec<HostRule>,
}

/// Whether `host` is a spelling of the loopback: the name `localhost`, an
/// IPv4 address in 127.0.0.0/8 or `::1` (also `::ffff:127.x.y.z`).
fn is_loopback_host(host: &Host) -> bool {
    match host {
        Host::Name(n) => n == "localhost",
        Host::Ip(ip) => ip.is_loopback(),
    }
}

/// Whether a `network.local` entry is well formed: a loopback spelling and an
/// explicit port. Used by validation; says what is wrong.
pub(crate) fn check_local_rule(rule: &HostRule) -> Result<(), &'static str> {
    let loopback = match &rule.pattern {
        HostPattern::Name(n) => n == "localhost",
        HostPattern::Ip(ip) => ip.is_loopback(),
        HostPattern::Subdomains(_) | HostPattern::Cidr(..) => false,
    };
    if !loopback {
        return Err("is not a loopback host: network.local opens ports of this machine's loopback only (another host goes in network.allow; an internal address needs a [network.hosts] mapping)");
    }
    if rule.port.is_none() {
        return Err("has no port: name the one port the service listens on");
    }
    Ok(())
}

/// A rule's index in its list, for its [`Source`] (a policy's lists are
/// far shorter than `u32::MAX`).
fn index(i: usize) -> u32 {
    u32::try_from(i).unwrap_or(u32::MAX)
}

impl NetworkRules {
    /// Decides a connection to `host:port`. Names compare case-insensitively with a
    /// trailing dot ignored; IP literals (also in brackets) match only IP and CIDR rules.
    /// `Approve` means: unlisted, and `unlisted = "approve"` asks a human.
    pub fn decide(&self, host: &str, port: u16) -> Decision {
        let Some(h) = normalize_host(host) else {
            return Decision::deny(Reason::NetworkInvalidHost, Source::Network);
        };
        if let Some((i, rule)) = self
            .deny
            .iter()
            .enumerate()
            // a deny without a port is absolute: every port
            .find(|(_, r)| r.matches(&h, port, true))
        {
            return Decision::deny(
                Reason::NetworkDeny,
                Source::NetworkDeny(index(i), rule.text.clone()),
            );
        }
        let loopback = is_loopback_host(&h);
        if loopback {
            if let Some((i, rule)) = self.local_rule(&h, port) {
                return Decision::allow(
                    Reason::NetworkLocal,
                    Source::NetworkLocal(index(i), rule.text.clone()),
                );
            }
        }
        if let Some((i, rule)) = self
            .allow
            .iter()
            .enumerate()
            .find(|(_, r)| r.matches(&h, port, false))
        {
            return Decision::allow(
                Reason::NetworkAllow,
                Source::NetworkAllow(index(i), rule.text.clone()),
            );
        }
        if loopback {
            // The machine mcpbox runs on: opened by `network.local` alone,
            // never by asking (the proxy's address guard would refuse it
            // after any answer). An allow entry above still decides for
            // mcpbox's own connections (a remote upstream on loopback).
            return Decision::deny(Reason::NetworkLocalUnlisted, Source::NetworkLocalUnlisted);
        }
        match self.unlisted {
            Unlisted::Deny => Decision::deny(Reason::NetworkUnlisted, Source::NetworkUnlisted),
            Unlisted::Approve => {
                Decision::approve(Reason::NetworkUnlisted, Source::NetworkUnlisted)
            }
        }
    }

    /// Decides whether the sandbox's resolver may give `host` an address:
    /// the first `Allow` over the ports any rule could open for it (80,
    /// 443 and every port an allow or local entry names), else `Approve`
    /// if one port would ask a human, else the refusal of port 443. The
    /// connection is decided again with its own port when it is made.
    pub fn decide_name(&self, host: &str) -> Decision {
        let named = self.allow.iter().chain(&self.local).filter_map(|r| r.port);
        let mut approve = None;
        let mut deny = None;
        for port in [80, 443].into_iter().chain(named) {
            let d = self.decide(host, port);
            match d.verdict {
                Verdict::Allow => return d,
                Verdict::Approve => {
                    approve.get_or_insert(d);
                }
                Verdict::Deny => {
                    if port == 443 || deny.is_none() {
                        deny = Some(d);
                    }
                }
            }
        }
        approve
            .or(deny)
            .unwrap_or_else(|| Decision::deny(Reason::NetworkUnlisted, Source::NetworkUnlisted))
    }

    /// Where a deny rule takes hosts (and ports) out of an allow rule, said
    /// for `mcpbox check`: `deny` wins, which may surprise whoever wrote
    /// the allow. One line per overlapping (deny, allow) pair.
    pub fn overlaps(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (i, d) in self.deny.iter().enumerate() {
            for (j, a) in self.allow.iter().enumerate() {
                if !patterns_overlap(&d.pattern, &a.pattern) {
                    continue;
                }
                let ports_meet = match (d.port, a.port) {
                    (None, _) => true,
                    (Some(p), Some(q)) => p == q,
                    (Some(p), None) => p == 80 || p == 443,
                };
                if ports_meet {
                    out.push(format!(
                        "network.deny[{i}] \"{}\" takes precedence over network.allow[{j}] \"{}\" where they overlap{}",
                        d.text.escape_debug(),
                        a.text.escape_debug(),
                        if d.port.is_none() { " (a deny without a port covers every port)" } else { "" }
                    ));
                }
            }
        }
        out
    }

    /// The `network.local` entry that opens `host:port`, if `host` is a
    /// loopback spelling and an entry names the port.
    fn local_rule(&self, host: &Host, port: u16) -> Option<(usize, &HostRule)> {
        if !is_loopback_host(host) {
            return None;
        }
        self.local
            .iter()
            .enumerate()
            .find(|(_, r)| r.port == Some(port))
    }

    /// The host's loopback addresses a connection to `host:port` goes to
    /// when `network.local` opens it (the address named, or for `localhost`
    /// 127.0.0.1 then ::1); `None` when no entry does. The egress proxy
    /// connects to these without its loopback refusal.
    pub fn local_addresses(&self, host: &str, port: u16) -> Option<Vec<IpAddr>> {
        let h = normalize_host(host)?;
        self.local_rule(&h, port)?;
        Some(match h {
            Host::Ip(ip) => vec![ip],
            Host::Name(_) => vec![
                IpAddr::V4(Ipv4Addr::LOCALHOST),
                IpAddr::V6(Ipv6Addr::LOCALHOST),
            ],
        })
    }

    /// What `network.local` opens, one line per entry, for `mcpbox check`.
    pub fn local_summary(&self) -> Vec<String> {
        self.local
            .iter()
            .enumerate()
            .filter_map(|(i, r)| {
                let port = r.port?;
                Some(format!(
                    "network.local[{i}] \"{}\" lets the sandbox reach port {port} on this machine's loopback (localhost, 127.0.0.1, [::1]:{port}): whatever listens there answers the server as it would any local program",
                    r.text.escape_debug()
                ))
            })
            .collect()
    }

    /// The address `[network.hosts]` maps this name to, if any.
    pub fn mapped_address(&self, host: &str) -> Option<IpAddr> {
        let name = normalize_name(host)?;
        self.hosts
            .iter()
            .find(|(k, _)| normalize_name(k).as_deref() == Some(name.as_str()))
            .map(|(_, ip)| *ip)
    }

    /// True when no egress can ever be allowed (no allow rule and unlisted hosts denied).
    pub fn is_closed(&self) -> bool {
        self.allow.is_empty() && self.local.is_empty() && self.unlisted == Unlisted::Deny
    }
}

/// Whether some host matches both patterns.
fn patterns_overlap(a: &HostPattern, b: &HostPattern) -> bool {
    let under = |name: &str, domain: &str| {
        name.len() > domain.len() + 1
            && name.ends_with(domain)
            && name.as_bytes()[name.len() - domain.len() - 1] == b'.'
    };
    match (a, b) {
        (HostPattern::Name(x), HostPattern::Name(y)) => x == y,
        (HostPattern::Subdomains(s), HostPattern::Name(n))
        | (HostPattern::Name(n), HostPattern::Subdomains(s)) => under(n, s),
        (HostPattern::Subdomains(x), HostPattern::Subdomains(y)) => {
            x == y || under(x, y) || under(y, x)
        }
        (HostPattern::Ip(x), HostPattern::Ip(y)) => x == y,
        (HostPattern::Ip(ip), HostPattern::Cidr(net, len))
        | (HostPattern::Cidr(net, len), HostPattern::Ip(ip)) => {
            net.is_ipv4() == ip.is_ipv4() && network_of(*ip, *len) == *net
        }
        (HostPattern::Cidr(n1, l1), HostPattern::Cidr(n2, l2)) => {
            let l = (*l1).min(*l2);
            n1.is_ipv4() == n2.is_ipv4() && network_of(*n1, l) == network_of(*n2, l)
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Reason, Verdict};

    fn rules(allow: &[&str], deny: &[&str]) -> NetworkRules {
        let p = |v: &[&str]| {
            v.iter()
                .map(|s| HostRule::parse(s).expect("valid pattern"))
                .collect()
        };
        NetworkRules {
            allow: p(allow),
            deny: p(deny),
            ..Default::default()
        }
    }

    fn allowed(r: &NetworkRules, host: &str, port: u16) -> bool {
        r.decide(host, port).verdict == Verdict::Allow
    }

    #[test]
    fn a_name_resolves_when_some_port_of_it_can_be_allowed() {
        let r = rules(&["dev.test:18971", "*.example.com"], &["bad.example.com"]);
        assert_eq!(r.decide_name("dev.test").verdict, Verdict::Allow);
        assert_eq!(r.decide_name("api.example.com").verdict, Verdict::Allow);
        // deny wins on every port: no address for it at all
        let d = r.decide_name("bad.example.com");
        assert_eq!((d.verdict, d.reason), (Verdict::Deny, Reason::NetworkDeny));
        let d = r.decide_name("other.test");
        assert_eq!(
            (d.verdict, d.reason),
            (Verdict::Deny, Reason::NetworkUnlisted)
        );
        let d = r.decide_name("x".repeat(300).as_str());
        assert_eq!(d.reason, Reason::NetworkInvalidHost);
        let mut ask = r.clone();
        ask.unlisted = Unlisted::Approve;
        assert_eq!(ask.decide_name("other.test").verdict, Verdict::Approve);
    }

    #[test]
    fn a_deny_without_a_port_covers_every_port_even_past_an_allow_with_one() {
        // the hole: `deny = ["uploads.example.com"]` used to cover 80 and
        // 443 only, so an allow on 8443 let that host through there
        let r = rules(&["*.example.com:8443"], &["uploads.example.com"]);
        for port in [80, 443, 8443, 22] {
            let d = r.decide("uploads.example.com", port);
            assert_eq!(d.verdict, Verdict::Deny, "port {port}: {d:?}");
            assert_eq!(d.reason, Reason::NetworkDeny, "port {port}: {d:?}");
        }
        assert_eq!(r.decide("api.example.com", 8443).verdict, Verdict::Allow);
        // an allow without a port is still the web ports only
        let r = rules(&["api.example.com"], &[]);
        assert_eq!(r.decide("api.example.com", 443).verdict, Verdict::Allow);
        assert_eq!(r.decide("api.example.com", 22).verdict, Verdict::Deny);
        // a deny with a port is that port only
        let r = rules(
            &["*.example.com:8443", "*.example.com"],
            &["uploads.example.com:443"],
        );
        assert_eq!(
            r.decide("uploads.example.com", 8443).verdict,
            Verdict::Allow
        );
        assert_eq!(r.decide("uploads.example.com", 443).verdict, Verdict::Deny);
    }

    #[test]
    fn overlapping_allow_and_deny_are_named_for_check() {
        let r = rules(
            &["*.example.com:8443", "api.other.org", "10.0.0.0/8"],
            &["uploads.example.com", "10.1.2.3:22", "unrelated.net"],
        );
        let o = r.overlaps();
        assert_eq!(o.len(), 1, "{o:?}");
        assert!(
            o[0].contains("network.deny[0]") && o[0].contains("network.allow[0]"),
            "{o:?}"
        );
        assert!(o[0].contains("every port"), "{o:?}");
        // a deny on a port the allow does not open does not overlap it
        let r = rules(&["10.0.0.0/8:443"], &["10.1.2.3:22"]);
        assert!(r.overlaps().is_empty());
        let r = rules(&["10.0.0.0/8"], &["10.1.0.0/16"]);
        assert_eq!(r.overlaps().len(), 1);
    }

    #[test]
    fn empty_allowlist_blocks_everything() {
        let r = NetworkRules::default();
        assert!(r.is_closed());
        assert_eq!(
            r.decide("api.github.com", 443),
            Decision::deny(Reason::NetworkUnlisted, "network.unlisted")
        );
    }

    #[test]
    fn wildcard_matches_subdomains_not_the_apex() {
        let r = rules(&["*.example.com"], &[]);
        assert!(allowed(&r, "a.example.com", 443));
        assert!(allowed(&r, "a.b.example.com", 80));
        assert!(!allowed(&r, "example.com", 443));
        assert!(!allowed(&r, "badexample.com", 443));
        assert!(!allowed(&r, "example.com.evil.net", 443));
    }

    #[test]
    fn names_compare_case_insensitively_ignoring_trailing_dot() {
        let r = rules(&["API.GitHub.com"], &[]);
        assert!(allowed(&r, "api.github.com.", 443));
        assert!(allowed(&r, "Api.GitHub.COM", 443));
        assert!(!allowed(&r, "api.github.com..", 443));
    }

    #[test]
    fn default_ports_are_web_ports_only() {
        let r = rules(&["a.com", "b.com:8080"], &[]);
        assert!(allowed(&r, "a.com", 80) && allowed(&r, "a.com", 443));
        assert!(!allowed(&r, "a.com", 22));
        assert!(allowed(&r, "b.com", 8080));
        assert!(!allowed(&r, "b.com", 443));
    }

    #[test]
    fn deny_beats_allow() {
        let r = rules(&["*.example.com"], &["secret.example.com"]);
        assert!(allowed(&r, "www.example.com", 443));
        assert_eq!(
            r.decide("SECRET.example.com", 443),
            Decision::deny(
                Reason::NetworkDeny,
                "network.deny[0] \"secret.example.com\""
            )
        );
    }

    #[test]
    fn ip_literal_needs_an_ip_rule() {
        let r = rules(
            &[
                "localhost",
                "*.example.com",
                "10.0.0.0/8",
                "[::1]:8080",
                "192.168.1.1",
            ],
            &[],
        );
        assert!(!allowed(&r, "127.0.0.1", 443));
        assert!(allowed(&r, "10.20.30.40", 443));
        assert!(
            allowed(&r, "::ffff:10.0.0.1", 443),
            "v4-mapped v6 is the v4 address"
        );
        assert!(allowed(&r, "[::1]", 8080));
        assert!(allowed(&r, "::1", 8080));
        assert!(!allowed(&r, "::1", 443));
        assert!(allowed(&r, "192.168.1.1", 80));
        assert!(!allowed(&r, "192.168.1.2", 80));
        assert!(!allowed(&r, "11.0.0.1", 443));
    }

    #[test]
    fn garbage_hosts_are_denied() {
        let r = rules(&["a.com"], &[]);
        for h in [
            "",
            "a.com/x",
            "a .com",
            "[a.com]",
            "*",
            "a.com:443",
            "\u{0}",
        ] {
            assert_eq!(
                r.decide(h, 443),
                Decision::deny(Reason::NetworkInvalidHost, "network"),
                "{h:?}"
            );
        }
    }

    #[test]
    fn unlisted_approve_asks() {
        let mut r = rules(&["a.com"], &["b.com"]);
        r.unlisted = Unlisted::Approve;
        assert_eq!(
            r.decide("c.com", 443),
            Decision::approve(Reason::NetworkUnlisted, "network.unlisted")
        );
        assert_eq!(r.decide("b.com", 443).verdict, Verdict::Deny);
    }

    #[test]
    fn mapped_addresses_by_normalized_name() {
        let mut r = NetworkRules::default();
        r.hosts
            .insert("internal.api".into(), "10.1.2.3".parse().expect("ip"));
        assert_eq!(r.mapped_address("Internal.API."), "10.1.2.3".parse().ok());
        assert_eq!(r.mapped_address("other"), None);
    }

    #[test]
    fn patterns_that_match_everything_are_refused() {
        for p in [
            "*",
            "*.*",
            "*.com",
            "*.",
            "0.0.0.0/0",
            "::/0",
            "*.*.example.com",
            "a*.example.com",
            "api.*.com",
        ] {
            assert!(HostRule::parse(p).is_err(), "{p:?} should be refused");
        }
    }

    #[test]
    fn malformed_patterns_are_refused() {
        for p in [
            "",
            "a.com:0",
            "a.com:65536",
            "a.com:",
            "a.com:x",
            "https://a.com",
            "a com",
            "10.0.0.0/33",
            "10.1.0.0/8",
            "[::1",
            "[::1]x",
            "-a.com",
            "a..com",
            "999.1.1.1",
            "1.2.3",
            "::1:80:zz",
            "user@a.com",
        ] {
            assert!(HostRule::parse(p).is_err(), "{p:?} should be refused");
        }
        for p in [
            "a.com",
            "a.com:8443",
            "*.a.com",
            "10.0.0.0/8",
            "[fd00::/8]:443",
            "::1",
            "[::1]:8080",
            "1.2.3.4:22",
        ] {
            assert!(HostRule::parse(p).is_ok(), "{p:?} should be accepted");
        }
    }
}
