//! The sandbox's resolver, as bytes in and bytes out: a strict parser for
//! the one kind of DNS query a stub resolver sends, the answers the bridge
//! gives, and the table that maps an answered address back to its name
//! (ARCHITECTURE.md, "Transparent egress"). No I/O; `bridge.rs` owns the sockets and asks the
//! proxy whether a name may be resolved.
//!
//! Written by hand rather than with a DNS crate: the subset is small (one
//! question, class IN, no name compression in it, answers of one A record
//! or none) and everything else is refused, which a general parser would
//! accept first. RFC 1035 section 4.1 is the format.

use std::collections::HashMap;
use std::net::Ipv4Addr;

/// The largest query read: a stub's query is far smaller; a larger
/// datagram is cut (and then fails to parse) rather than buffered.
pub const MAX_QUERY: usize = 1232;

/// How long an answer may be cached. A synthetic address means its name
/// for the sandbox's whole life; a real one is the proxy's lookup of the
/// moment (the proxy resolves again for every connection, so a stale one
/// still reaches the name, but the program should ask again soon).
const TTL_SYNTHETIC: u32 = 300;
const TTL_REAL: u32 = 30;

/// The most A records in one answer.
pub const MAX_ANSWERS: usize = 8;

/// How many names the table holds; one more is SERVFAIL, never a reused
/// address (an address always means the one name it was given for).
pub const TABLE_CAPACITY: u32 = 8192;

/// The first synthetic address: 198.18.0.0/15 is the benchmarking range
/// (RFC 2544), never a real destination; the proxy refuses it as an
/// address, so a synthetic address that is not in the table reaches
/// nothing.
const SYNTHETIC_BASE: u32 = u32::from_be_bytes([198, 18, 0, 0]);

/// Response codes (RFC 1035 4.1.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rcode {
    NoError = 0,
    FormErr = 1,
    ServFail = 2,
    NxDomain = 3,
    NotImp = 4,
    Refused = 5,
}

const TYPE_A: u16 = 1;
const CLASS_IN: u16 = 1;

/// One well-formed question.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Query<'a> {
    pub id: u16,
    /// Recursion desired, echoed back.
    pub rd: bool,
    /// The name, lowercased, labels joined by dots, no trailing dot; `None`
    /// when a label holds a byte no host name has (the answer is NXDOMAIN
    /// without asking anyone).
    pub name: Option<String>,
    pub qtype: u16,
    /// The question section as received, echoed verbatim (a stub may
    /// randomise the case of the name and check it comes back).
    question: &'a [u8],
}

/// What to do with one datagram or TCP message.
#[derive(Debug, PartialEq, Eq)]
pub enum Parsed<'a> {
    /// A query to answer.
    Query(Query<'a>),
    /// Malformed or unsupported, and safe to say so: this reply, and why
    /// (for the audit record of the refusal).
    Refused { reply: Vec<u8>, why: &'static str },
    /// Not a query at all (too short, or a response): no answer, so that
    /// two resolvers cannot be made to talk to each other forever.
    Drop,
}

/// Why a query was refused: the ones a test names.
pub const TOO_LONG: &str = "a name longer than DNS allows (255 bytes)";
const CUT_SHORT: &str = "a question cut short";
/// A name with a byte no host name has (answered NXDOMAIN).
pub const INVALID_NAME: &str = "a name with bytes no host name has";

fn refused(reply: Vec<u8>, why: &'static str) -> Parsed<'static> {
    Parsed::Refused { reply, why }
}

/// Parses one query message.
pub fn parse(msg: &[u8]) -> Parsed<'_> {
    if msg.len() < 12 {
        return Parsed::Drop;
    }
    let id = u16::from_be_bytes([msg[0], msg[1]]);
    let flags = u16::from_be_bytes([msg[2], msg[3]]);
    if flags & 0x8000 != 0 {
        return Parsed::Drop;
    }
    let rd = flags & 0x0100 != 0;
    let count = |at: usize| u16::from_be_bytes([msg[at], msg[at + 1]]);
    let opcode = (flags >> 11) & 0xf;
    if opcode != 0 {
        return refused(
            header_only(id, rd, Rcode::NotImp),
            "a DNS opcode other than QUERY",
        );
    }
    // One question, no answers or authority; at most one additional
    // record (an EDNS OPT), which is ignored.
    if count(4) != 1 || count(6) != 0 || count(8) != 0 || count(10) > 1 {
        return refused(
            header_only(id, rd, Rcode::FormErr),
            "not exactly one question",
        );
    }
    let mut at = 12;
    let mut name = String::new();
    let mut valid = true;
    loop {
        let Some(&len) = msg.get(at) else {
            return refused(header_only(id, rd, Rcode::FormErr), CUT_SHORT);
        };
        at += 1;
        if len == 0 {
            break;
        }
        // 64..=255: compression pointers and reserved label types, which a
        // question has no need of.
        if len > 63 {
            return refused(
                header_only(id, rd, Rcode::FormErr),
                "a compressed or over-long label in the question",
            );
        }
        let Some(label) = msg.get(at..at + usize::from(len)) else {
            return refused(header_only(id, rd, Rcode::FormErr), CUT_SHORT);
        };
        at += usize::from(len);
        // RFC 1035 2.3.4: a name is at most 255 bytes on the wire.
        if at - 12 > 255 {
            return refused(header_only(id, rd, Rcode::FormErr), TOO_LONG);
        }
        if !name.is_empty() {
            name.push('.');
        }
        for &b in label {
            if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' {
                name.push(char::from(b.to_ascii_lowercase()));
            } else {
                valid = false;
            }
        }
    }
    let Some(tail) = msg.get(at..at + 4) else {
        return refused(header_only(id, rd, Rcode::FormErr), CUT_SHORT);
    };
    let qtype = u16::from_be_bytes([tail[0], tail[1]]);
    let qclass = u16::from_be_bytes([tail[2], tail[3]]);
    let question = &msg[12..at + 4];
    if qclass != CLASS_IN {
        return refused(
            reply(id, rd, question, Rcode::NotImp, &[], 0),
            "a query class other than IN",
        );
    }
    Parsed::Query(Query {
        id,
        rd,
        name: (valid && !name.is_empty()).then_some(name),
        qtype,
        question,
    })
}

/// The addresses of one answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// The name's synthetic address (it has no real one the sandbox may
    /// be given).
    Synthetic(Ipv4Addr),
    /// Its real, public addresses, as the proxy resolved them (at most
    /// [`MAX_ANSWERS`] are sent).
    Real(Vec<Ipv4Addr>),
}

impl Query<'_> {
    /// The answer: A records with the addresses for a query of type A, no
    /// records (NOERROR, "no data") for any other type of a name that has
    /// them; `rcode` alone otherwise.
    pub fn answer(&self, rcode: Rcode, addrs: Option<&Answer>) -> Vec<u8> {
        let (ips, ttl): (&[Ipv4Addr], u32) = match addrs {
            _ if self.qtype != TYPE_A => (&[], 0),
            None => (&[], 0),
            Some(Answer::Synthetic(ip)) => (std::slice::from_ref(ip), TTL_SYNTHETIC),
            Some(Answer::Real(ips)) => (&ips[..ips.len().min(MAX_ANSWERS)], TTL_REAL),
        };
        reply(self.id, self.rd, self.question, rcode, ips, ttl)
    }
}

fn header(out: &mut Vec<u8>, id: u16, rd: bool, rcode: Rcode, qd: u16, an: u16) {
    // QR, opcode 0, AA (the table is the authority), RD echoed, RA.
    let rd_bit = if rd { 0x0100 } else { 0 };
    let flags = 0x8000 | 0x0400 | rd_bit | 0x0080 | rcode as u16;
    for word in [id, flags, qd, an, 0, 0] {
        out.extend_from_slice(&word.to_be_bytes());
    }
}

fn header_only(id: u16, rd: bool, rcode: Rcode) -> Vec<u8> {
    let mut out = Vec::with_capacity(12);
    header(&mut out, id, rd, rcode, 0, 0);
    out
}

fn reply(id: u16, rd: bool, question: &[u8], rcode: Rcode, ips: &[Ipv4Addr], ttl: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(12 + question.len() + 16 * ips.len());
    // At most MAX_ANSWERS (`answer`), so the count fits.
    let count = u16::try_from(ips.len()).unwrap_or(0);
    header(&mut out, id, rd, rcode, 1, count);
    out.extend_from_slice(question);
    for ip in ips {
        // A pointer to the question's name (offset 12), type A, class IN.
        out.extend_from_slice(&[0xc0, 12]);
        out.extend_from_slice(&TYPE_A.to_be_bytes());
        out.extend_from_slice(&CLASS_IN.to_be_bytes());
        out.extend_from_slice(&ttl.to_be_bytes());
        out.extend_from_slice(&4u16.to_be_bytes());
        out.extend_from_slice(&ip.octets());
    }
    out
}

/// Whether `ip` is in the synthetic range (198.18.0.0/15).
pub fn is_synthetic(ip: Ipv4Addr) -> bool {
    u32::from(ip) >> 17 == SYNTHETIC_BASE >> 17
}

/// The names the resolver has answered: each synthetic address with its
/// name, both ways (never reused), and each real address with the name it
/// was last given for (names that share an address, as on a CDN, share
/// its entry: the latest lookup wins, and the proxy's TLS check refuses a
/// connection whose server name is not that name). Both bounded by
/// [`TABLE_CAPACITY`].
#[derive(Debug, Default)]
pub struct Names {
    by_name: HashMap<String, Ipv4Addr>,
    by_addr: HashMap<Ipv4Addr, String>,
    real: HashMap<Ipv4Addr, String>,
}

impl Names {
    /// The address already given to `name`, if any.
    pub fn get(&self, name: &str) -> Option<Ipv4Addr> {
        self.by_name.get(name).copied()
    }

    /// The address for `name`: the one it has, or the next free one;
    /// `None` when the table is full.
    pub fn assign(&mut self, name: &str) -> Option<Ipv4Addr> {
        if let Some(ip) = self.get(name) {
            return Some(ip);
        }
        let n = u32::try_from(self.by_name.len()).ok()?;
        if n >= TABLE_CAPACITY {
            return None;
        }
        // .0 is skipped: some programs treat an address ending in .0 as
        // a network.
        let ip = Ipv4Addr::from(SYNTHETIC_BASE + 1 + n);
        self.by_name.insert(name.to_string(), ip);
        self.by_addr.insert(ip, name.to_string());
        Some(ip)
    }

    /// Notes that `name` was answered with the real addresses `ips`;
    /// `false` (nothing noted) when that would take the table past its
    /// bound.
    pub fn note_real(&mut self, name: &str, ips: &[Ipv4Addr]) -> bool {
        let new = ips.iter().filter(|ip| !self.real.contains_key(ip)).count();
        if self.real.len() + new > TABLE_CAPACITY as usize {
            return false;
        }
        for ip in ips {
            self.real.insert(*ip, name.to_string());
        }
        true
    }

    /// The name an address was given for: a synthetic address's one name,
    /// or the latest name a real address was answered for.
    pub fn name_of(&self, ip: Ipv4Addr) -> Option<&str> {
        if is_synthetic(ip) {
            return self.by_addr.get(&ip).map(String::as_str);
        }
        self.real.get(&ip).map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    /// A query as a stub sends it: id 0x1234, RD, one question.
    fn query(labels: &[&str], qtype: u16) -> Vec<u8> {
        let mut q = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
        for l in labels {
            q.push(l.len() as u8);
            q.extend_from_slice(l.as_bytes());
        }
        q.push(0);
        q.extend_from_slice(&qtype.to_be_bytes());
        q.extend_from_slice(&CLASS_IN.to_be_bytes());
        q
    }

    fn rcode(reply: &[u8]) -> u8 {
        reply[3] & 0xf
    }

    #[test]
    fn an_a_query_is_answered_with_the_address_and_the_question_echoed() {
        let q = query(&["Dev", "TEST"], TYPE_A);
        let Parsed::Query(p) = parse(&q) else {
            panic!()
        };
        assert_eq!(p.name.as_deref(), Some("dev.test"));
        let ip = Ipv4Addr::new(198, 18, 0, 1);
        let r = p.answer(Rcode::NoError, Some(&Answer::Synthetic(ip)));
        assert_eq!(&r[..2], &[0x12, 0x34]);
        assert_eq!(r[2] & 0x80, 0x80, "a response");
        assert_eq!(rcode(&r), 0);
        assert_eq!(u16::from_be_bytes([r[6], r[7]]), 1, "one answer");
        assert_eq!(&r[12..q.len()], &q[12..], "question verbatim");
        assert_eq!(&r[r.len() - 4..], &ip.octets());
    }

    #[test]
    fn aaaa_of_an_allowed_name_is_no_data_and_a_refused_name_is_nxdomain() {
        let q = query(&["dev", "test"], 28);
        let Parsed::Query(p) = parse(&q) else {
            panic!()
        };
        let r = p.answer(
            Rcode::NoError,
            Some(&Answer::Synthetic(Ipv4Addr::new(198, 18, 0, 1))),
        );
        assert_eq!((rcode(&r), r[7]), (0, 0));
        let r = p.answer(Rcode::NxDomain, None);
        assert_eq!((rcode(&r), r[7]), (3, 0));
    }

    #[test]
    fn a_name_longer_than_dns_allows_is_formerr() {
        let label = "a".repeat(63);
        let labels: Vec<&str> = vec![label.as_str(); 5];
        let Parsed::Refused { reply: r, why } = parse(&query(&labels, TYPE_A)) else {
            panic!()
        };
        assert_eq!(why, TOO_LONG);
        assert_eq!(rcode(&r), Rcode::FormErr as u8);
        let long = "a".repeat(64);
        let Parsed::Refused { reply: r, .. } = parse(&query(&[long.as_str()], TYPE_A)) else {
            panic!()
        };
        assert_eq!(rcode(&r), Rcode::FormErr as u8);
    }

    #[test]
    fn compression_pointers_and_responses_are_not_followed() {
        let mut q = query(&["x"], TYPE_A);
        q[12] = 0xc0;
        assert!(matches!(parse(&q), Parsed::Refused { .. }));
        let mut r = query(&["x"], TYPE_A);
        r[2] |= 0x80;
        assert_eq!(parse(&r), Parsed::Drop);
    }

    #[test]
    fn bytes_no_host_name_has_make_the_name_invalid() {
        let q = query(&["a b", "test"], TYPE_A);
        let Parsed::Query(p) = parse(&q) else {
            panic!()
        };
        assert_eq!(p.name, None);
        let q = query(&["evil\r\nhost"], TYPE_A);
        let Parsed::Query(p) = parse(&q) else {
            panic!()
        };
        assert_eq!(p.name, None);
    }

    /// Every prefix and every single-byte change of a valid query parses
    /// to something without panicking, and a reply is never larger than
    /// the query plus one answer record.
    #[test]
    fn fuzz_style_mutations_never_panic() {
        let base = query(&["api", "example", "com"], TYPE_A);
        crate::mutations(&base, 20_000, |m| match parse(m) {
            Parsed::Query(q) => {
                let ips = vec![Ipv4Addr::new(93, 184, 216, 34); MAX_ANSWERS + 3];
                let r = q.answer(Rcode::NoError, Some(&Answer::Real(ips)));
                assert!(r.len() <= m.len() + 16 * MAX_ANSWERS);
            }
            Parsed::Refused { reply: r, .. } => assert!(r.len() <= m.len()),
            Parsed::Drop => {}
        });
    }

    #[test]
    fn real_addresses_are_answered_in_full_up_to_the_bound_with_a_short_ttl() {
        let q = query(&["api", "example", "com"], TYPE_A);
        let Parsed::Query(p) = parse(&q) else {
            panic!()
        };
        let ips: Vec<Ipv4Addr> = (1..=10).map(|i| Ipv4Addr::new(93, 184, 216, i)).collect();
        let r = p.answer(Rcode::NoError, Some(&Answer::Real(ips.clone())));
        assert_eq!(usize::from(r[7]), MAX_ANSWERS);
        let first = q.len();
        assert_eq!(&r[first + 6..first + 10], &TTL_REAL.to_be_bytes());
        assert_eq!(&r[first + 12..first + 16], &ips[0].octets());
        assert_eq!(r.len(), q.len() + 16 * MAX_ANSWERS);
    }

    #[test]
    fn a_real_address_maps_to_the_latest_name_and_never_to_a_synthetic_one() {
        let mut t = Names::default();
        let cdn = Ipv4Addr::new(93, 184, 216, 34);
        assert!(t.note_real("a.example", &[cdn]));
        assert_eq!(t.name_of(cdn), Some("a.example"));
        assert!(t.note_real("b.example", &[cdn]));
        assert_eq!(t.name_of(cdn), Some("b.example"));
        // A synthetic address is only ever its own name's.
        let syn = t.assign("dev.test").unwrap();
        assert_eq!(t.name_of(syn), Some("dev.test"));
        assert_eq!(t.name_of(Ipv4Addr::new(198, 18, 0, 99)), None);
        assert_eq!(t.name_of(Ipv4Addr::new(8, 8, 8, 8)), None);
    }

    #[test]
    fn the_real_table_is_bounded() {
        let mut t = Names::default();
        for i in 0..TABLE_CAPACITY {
            assert!(t.note_real("n.example", &[Ipv4Addr::from(0x0101_0000 + i)]));
        }
        // Addresses it holds may change name; a new one does not fit.
        assert!(t.note_real("m.example", &[Ipv4Addr::from(0x0101_0000)]));
        assert!(!t.note_real("m.example", &[Ipv4Addr::new(9, 9, 9, 9)]));
        assert_eq!(t.name_of(Ipv4Addr::new(9, 9, 9, 9)), None);
    }

    #[test]
    fn the_table_maps_both_ways_is_bounded_and_never_reuses() {
        let mut t = Names::default();
        let a = t.assign("a.test").unwrap();
        assert_eq!(a, Ipv4Addr::new(198, 18, 0, 1));
        assert_eq!(t.assign("a.test"), Some(a));
        assert_eq!(t.name_of(a), Some("a.test"));
        assert!(is_synthetic(a));
        assert!(is_synthetic(Ipv4Addr::new(198, 19, 255, 255)));
        assert!(!is_synthetic(Ipv4Addr::new(198, 20, 0, 1)));
        for i in 1..TABLE_CAPACITY {
            assert!(t.assign(&format!("n{i}.test")).is_some());
        }
        assert_eq!(t.assign("one-more.test"), None);
        assert_eq!(t.name_of(a), Some("a.test"));
        assert!(is_synthetic(
            t.get(&format!("n{}.test", TABLE_CAPACITY - 1)).unwrap()
        ));
    }
}
