//! The in-sandbox end of the egress path, one process inside the sandbox's
//! network namespace serving the sockets the init bound for it:
//!
//! - the proxy listener (`127.0.0.1:3128`, named by the proxy variables):
//!   each connection is carried as is over the proxy's Unix socket
//!   (bind-mounted into the sandbox);
//! - the capture listener (`127.0.0.1:3129`): every other outbound TCP
//!   connection of the sandbox arrives here (the nftables rule of
//!   `mcpbox-sandbox`'s netns.rs); the bridge reads where it was going
//!   (`SO_ORIGINAL_DST`) and opens it through the proxy with `CONNECT`,
//!   by name for an address its resolver gave out for a name;
//! - the resolver (`127.0.0.1:53`, UDP and TCP): a name the policy allows
//!   gets the public addresses the proxy resolved it to on the host, or a
//!   synthetic address when it has none the sandbox may be given (a
//!   `[network.hosts]` mapping, a name only a human can allow); every
//!   other name NXDOMAIN (the proxy records the refusal), and a query it
//!   cannot take is reported to the proxy, which records it;
//! - the NFLOG socket: the packets the capture does not carry (UDP other
//!   than the resolver, IPv6), refused inside the namespace, each reported
//!   to the proxy (`REFUSED address HTTP/1.1`) so that it is audited.
//!
//! So the sandbox reaches the proxy and nothing else, and the proxy decides
//! by name for every program, whether it honours the proxy variables or
//! not (ARCHITECTURE.md, "Transparent egress").

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream, UdpSocket};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::dns::{self, Answer, Names, Parsed, Rcode};
use crate::pool::Pool;
use crate::stream::splice_both;

/// The request method the bridge asks the proxy about a name with:
/// `RESOLVE name HTTP/1.1`; the proxy answers 200 (the policy can allow
/// it, or would ask) or its refusal, recorded.
pub const RESOLVE_METHOD: &str = "RESOLVE";

/// The request method the bridge reports a packet the namespace refused
/// with: `REFUSED address:port HTTP/1.1` and the protocol in
/// [`PROTOCOL_HEADER`]; the proxy records it and answers 200.
pub const REFUSED_METHOD: &str = "REFUSED";

/// The header naming the refused packet's protocol (`udp`, `tcp6`, ...,
/// `dns` for a query the resolver refused).
pub const PROTOCOL_HEADER: &str = "X-Mcpbox-Protocol";

/// The header saying why a `dns` query was refused (dns.rs's words).
pub const WHY_HEADER: &str = "X-Mcpbox-Why";

/// How many refusals one bridge reports itself (refused packets, each
/// (protocol, destination) once; refused queries); past this bound no more
/// (a flood is refused all the same, and costs the audit nothing more).
const MAX_REFUSALS_REPORTED: usize = 1024;

/// The largest proxy answer head the bridge reads (a refusal's head and
/// body are far smaller; anything longer is a refusal too).
const MAX_ANSWER: usize = 8 * 1024;

/// How long the proxy may take to answer a `RESOLVE` or a `CONNECT` (a
/// `CONNECT` under `unlisted = "approve"` waits for a human; the proxy owns
/// that timeout, this only stops a bridge thread waiting forever).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(300);

/// How long a TCP resolver client may take to send its query.
const DNS_TCP_TIMEOUT: Duration = Duration::from_secs(5);

/// The sockets the bridge serves (bound by the sandbox's init).
pub struct Sockets {
    pub proxy: TcpListener,
    pub capture: TcpListener,
    pub dns_udp: UdpSocket,
    pub dns_tcp: TcpListener,
    /// The namespace's NFLOG group of the packets the capture does not
    /// carry.
    pub nflog: std::os::fd::OwnedFd,
}

/// Serves `sockets` forever towards the Unix socket at `target`. Returns
/// only on a non-transient accept error of the proxy listener.
///
/// Handing the accepted socket to the proxy instead (SCM_RIGHTS, so that the
/// proxy splices sandbox socket <-> upstream itself, commit 23cade3) was
/// measured on 2026-12-03: connect time added fell (microbench +228 -> +157
/// us at the median) but throughput fell too, end to end from about 80-100%
/// of direct to about 60% (TCP -> pipe -> TCP in one relay is slower here
/// than TCP -> unix -> TCP in two), so the bridge keeps relaying.
pub fn bridge(sockets: Sockets, target: &Path) -> io::Result<()> {
    let shared = Arc::new(Shared {
        target: target.to_path_buf(),
        names: Mutex::new(Names::default()),
        pool: Pool::new("egress-bridge"),
        reported: std::sync::atomic::AtomicUsize::new(0),
    });
    let Sockets {
        proxy,
        capture,
        dns_udp,
        dns_tcp,
        nflog,
    } = sockets;
    let s = Arc::clone(&shared);
    spawn("egress-nflog", move || serve_nflog(&nflog, &s))?;
    let s = Arc::clone(&shared);
    spawn("egress-dns-udp", move || serve_dns_udp(&dns_udp, &s))?;
    let s = Arc::clone(&shared);
    spawn("egress-dns-tcp", move || serve_dns_tcp(&dns_tcp, &s))?;
    let s = Arc::clone(&shared);
    spawn("egress-capture", move || serve_capture(&capture, &s))?;
    accept_loop(&proxy, |tcp| {
        let s = Arc::clone(&shared);
        shared.pool.run(move || match UnixStream::connect(&s.target) {
            Ok(unix) => {
                if let Err(e) = splice_both(tcp, unix, &s.pool) {
                    tracing::warn!(error = %e, "bridge relay failed");
                }
            }
            // The proxy is gone: closing the TCP side is the answer.
            Err(e) => {
                tracing::warn!(error = %e, path = %s.target.display(), "bridge could not reach the proxy socket")
            }
        })
    })
}

/// What the bridge's threads share.
struct Shared {
    target: PathBuf,
    names: Mutex<Names>,
    pool: Pool,
    /// How many refusals the bridge itself has reported (packets the
    /// namespace refused, queries the resolver could not take), bounded
    /// by [`MAX_REFUSALS_REPORTED`].
    reported: std::sync::atomic::AtomicUsize,
}

impl Shared {
    fn names(&self) -> std::sync::MutexGuard<'_, Names> {
        // A panic elsewhere leaves the table consistent (every change is
        // one insert pair), so a poisoned lock is still usable.
        match self.names.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    /// Sends `request` to the proxy and reads its answer head; `Ok(stream,
    /// Some(head))` for a 200, `Ok(stream, None)` for anything else.
    fn ask(&self, request: &[u8]) -> io::Result<(UnixStream, Option<Vec<u8>>)> {
        let mut unix = UnixStream::connect(&self.target)?;
        unix.set_read_timeout(Some(ANSWER_TIMEOUT))?;
        unix.write_all(request)?;
        // Byte by byte up to the blank line: nothing after the head may be
        // consumed, it belongs to the relayed stream.
        let mut head = Vec::with_capacity(64);
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            if head.len() >= MAX_ANSWER || unix.read(&mut byte)? == 0 {
                return Ok((unix, None));
            }
            head.push(byte[0]);
        }
        unix.set_read_timeout(None)?;
        let ok = head.starts_with(b"HTTP/1.1 200 ") || head.starts_with(b"HTTP/1.0 200 ");
        Ok((unix, ok.then_some(head)))
    }

    /// Reports one refusal the proxy never saw (`REFUSED address:port`,
    /// its protocol and why in headers), so that it is audited; at most
    /// [`MAX_REFUSALS_REPORTED`] per bridge, then none (a flood is refused
    /// all the same, and costs the audit nothing more).
    fn report_refusal(&self, to: std::net::SocketAddr, protocol: &str, why: Option<&str>) {
        use std::sync::atomic::Ordering;
        if self.reported.fetch_add(1, Ordering::Relaxed) >= MAX_REFUSALS_REPORTED {
            return;
        }
        let why = why
            .map(|w| format!("{WHY_HEADER}: {w}\r\n"))
            .unwrap_or_default();
        let request = format!(
            "{REFUSED_METHOD} {} HTTP/1.1\r\n{PROTOCOL_HEADER}: {protocol}\r\n{why}\r\n",
            refusal_target(to)
        );
        if let Err(e) = self.ask(request.as_bytes()) {
            tracing::warn!(error = %e, "could not report a refusal to the proxy");
        }
    }

    /// A query the resolver refused as malformed (FORMERR, NOTIMP) or
    /// answered NXDOMAIN for a name no host can have.
    fn report_malformed(&self, why: &str) {
        let resolver = std::net::SocketAddr::from((Ipv4Addr::LOCALHOST, 53));
        self.report_refusal(resolver, "dns", Some(why));
    }

    /// Answers one parsed query.
    fn resolve(&self, q: &dns::Query<'_>) -> Vec<u8> {
        let Some(name) = &q.name else {
            self.report_malformed(dns::INVALID_NAME);
            return q.answer(Rcode::NxDomain, None);
        };
        // A synthetic address, once given, is the name's for good.
        if let Some(ip) = self.names().get(name) {
            return q.answer(Rcode::NoError, Some(&Answer::Synthetic(ip)));
        }
        // The name is [a-z0-9_-] labels joined by dots (dns.rs), so it
        // cannot break the request line.
        let request = format!("{RESOLVE_METHOD} {name} HTTP/1.1\r\n\r\n");
        match self.ask(request.as_bytes()) {
            Ok((_, Some(head))) => {
                let Some(real) = resolved_addresses(&head) else {
                    tracing::warn!("unreadable resolver answer from the proxy; answering SERVFAIL");
                    return q.answer(Rcode::ServFail, None);
                };
                let mut names = self.names();
                let answer = if real.is_empty() {
                    names.assign(name).map(Answer::Synthetic)
                } else {
                    names.note_real(name, &real).then_some(Answer::Real(real))
                };
                drop(names);
                match answer {
                    Some(a) => q.answer(Rcode::NoError, Some(&a)),
                    None => {
                        tracing::warn!("resolver table full; answering SERVFAIL");
                        q.answer(Rcode::ServFail, None)
                    }
                }
            }
            Ok((_, None)) => q.answer(Rcode::NxDomain, None),
            Err(e) => {
                tracing::warn!(error = %e, "resolver could not reach the proxy");
                q.answer(Rcode::ServFail, None)
            }
        }
    }

    /// Opens one captured connection through the proxy.
    fn carry(&self, tcp: TcpStream) {
        let dst = match rustix::net::sockopt::ip_original_dst(&tcp) {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(error = %e, "captured connection without an original destination");
                return reset(tcp);
            }
        };
        let target = self.authority(dst);
        let request = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n");
        match self.ask(request.as_bytes()) {
            Ok((unix, Some(_))) => {
                if let Err(e) = splice_both(tcp, unix, &self.pool) {
                    tracing::warn!(error = %e, "bridge relay failed");
                }
            }
            // Refused: the proxy recorded why; the program sees a reset.
            Ok((_, None)) => reset(tcp),
            Err(e) => {
                tracing::warn!(error = %e, path = %self.target.display(), "bridge could not reach the proxy socket");
                reset(tcp)
            }
        }
    }

    /// `name:port` for an address the resolver gave out for that name
    /// (the proxy then decides by the name and connects to what the name
    /// resolves to on the host, never to the address the program chose),
    /// the literal `a.b.c.d:port` otherwise (the policy must name it; an
    /// unknown synthetic address is refused by the proxy as an address
    /// class no allowed name may reach).
    fn authority(&self, dst: SocketAddrV4) -> String {
        let ip: Ipv4Addr = *dst.ip();
        if let Some(name) = self.names().name_of(ip) {
            return format!("{name}:{}", dst.port());
        }
        dst.to_string()
    }
}

/// The addresses in a 200 answer to `RESOLVE` (the proxy's
/// [`crate::proxy::RESOLVED_HEADER`]): empty for "give it a synthetic
/// address", `None` when the head is not what the proxy writes (no header,
/// or anything but IPv4 addresses there, or a synthetic one).
fn resolved_addresses(head: &[u8]) -> Option<Vec<Ipv4Addr>> {
    let head = std::str::from_utf8(head).ok()?;
    let value = head.split("\r\n").find_map(|line| {
        let (k, v) = line.split_once(':')?;
        k.eq_ignore_ascii_case(crate::proxy::RESOLVED_HEADER)
            .then_some(v.trim())
    })?;
    if value.is_empty() {
        return Some(Vec::new());
    }
    let mut out = Vec::new();
    for part in value.split(',') {
        let ip: Ipv4Addr = part.trim().parse().ok()?;
        if dns::is_synthetic(ip) || out.len() == dns::MAX_ANSWERS {
            return None;
        }
        out.push(ip);
    }
    Some(out)
}

/// Closes a captured connection with a reset, so that the program fails at
/// once rather than reading an empty answer.
fn reset(tcp: TcpStream) {
    let _ = rustix::net::sockopt::set_socket_linger(&tcp, Some(Duration::ZERO));
    drop(tcp);
}

fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> io::Result<()> {
    std::thread::Builder::new()
        .name(name.into())
        .stack_size(crate::THREAD_STACK)
        .spawn(f)
        .map(drop)
}

/// Accepts forever, handing each connection to `each`; returns on a
/// non-transient error.
fn accept_loop(
    listener: &TcpListener,
    mut each: impl FnMut(TcpStream) -> io::Result<()>,
) -> io::Result<()> {
    loop {
        let tcp = match listener.accept() {
            Ok((c, _)) => c,
            Err(e) if transient(&e) => {
                tracing::warn!(error = %e, "bridge accept failed; retrying");
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
            Err(e) => return Err(e),
        };
        let _ = tcp.set_nodelay(true);
        if let Err(e) = each(tcp) {
            tracing::warn!(error = %e, "bridge could not start a thread; dropping the connection");
        }
    }
}

fn serve_capture(listener: &TcpListener, shared: &Arc<Shared>) {
    let result = accept_loop(listener, |tcp| {
        let s = Arc::clone(shared);
        shared.pool.run(move || s.carry(tcp))
    });
    if let Err(e) = result {
        tracing::error!(error = %e, "capture listener stopped");
    }
}

/// One datagram at a time: a flood waits in the socket's receive buffer
/// (the kernel drops what does not fit), each query costs at most one
/// round trip to the proxy, and nothing is kept for a refused name.
fn serve_dns_udp(socket: &UdpSocket, shared: &Shared) {
    let mut buf = [0u8; dns::MAX_QUERY];
    loop {
        let (n, from) = match socket.recv_from(&mut buf) {
            Ok(r) => r,
            Err(e) if transient(&e) => continue,
            Err(e) => {
                tracing::error!(error = %e, "resolver socket failed");
                return;
            }
        };
        let reply = match dns::parse(&buf[..n]) {
            Parsed::Query(q) => shared.resolve(&q),
            Parsed::Refused { reply, why } => {
                shared.report_malformed(why);
                reply
            }
            Parsed::Drop => continue,
        };
        let _ = socket.send_to(&reply, from);
    }
}

/// Reads the NFLOG socket forever and reports each new (protocol,
/// destination) to the proxy, which records the refusal; at most
/// [`MAX_REFUSALS_REPORTED`] of them.
fn serve_nflog(fd: &std::os::fd::OwnedFd, shared: &Shared) {
    let mut seen = std::collections::HashSet::new();
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match rustix::io::read(fd, &mut buf) {
            Ok(n) => n,
            // SO_RCVTIMEO (the init set it for its own exchange), or an
            // interrupted read: nothing lost.
            Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR) => continue,
            // More packets than the socket's buffer held: those are not
            // reported, the kernel refused them all the same.
            Err(rustix::io::Errno::NOBUFS) => {
                tracing::warn!("refused packets came faster than they could be recorded; some are not in the audit");
                continue;
            }
            Err(e) => {
                tracing::error!(error = %e, "the refused-packet log stopped");
                return;
            }
        };
        for p in crate::nflog::packets(&buf[..n]) {
            // Each (protocol, destination) once: a program retrying one
            // destination is one refusal in the audit.
            if seen.len() >= MAX_REFUSALS_REPORTED || !seen.insert(p) {
                continue;
            }
            shared.report_refusal(p.to, &p.protocol_name(), None);
        }
    }
}

/// TCP queries (RFC 1035 4.2.2: a two-byte length before each message),
/// one connection at a time, each with a deadline to send its query.
fn serve_dns_tcp(listener: &TcpListener, shared: &Shared) {
    let _ = accept_loop(listener, |mut tcp| {
        let _ = tcp.set_read_timeout(Some(DNS_TCP_TIMEOUT));
        let mut len = [0u8; 2];
        let mut buf = [0u8; dns::MAX_QUERY];
        while tcp.read_exact(&mut len).is_ok() {
            let n = usize::from(u16::from_be_bytes(len));
            if n > buf.len() || tcp.read_exact(&mut buf[..n]).is_err() {
                break;
            }
            let reply = match dns::parse(&buf[..n]) {
                Parsed::Query(q) => shared.resolve(&q),
                Parsed::Refused { reply, why } => {
                    shared.report_malformed(why);
                    reply
                }
                Parsed::Drop => break,
            };
            let Ok(rlen) = u16::try_from(reply.len()) else {
                break;
            };
            if tcp.write_all(&rlen.to_be_bytes()).is_err() || tcp.write_all(&reply).is_err() {
                break;
            }
        }
        Ok(())
    });
}

fn transient(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted | io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock
    ) || matches!(e.raw_os_error(), Some(23 | 24 | 105))
}

/// The target of a `REFUSED` report: `address:port`, or the address alone
/// for a protocol without ports (ICMP, port 0: no port, which the proxy's
/// authority parser refuses).
fn refusal_target(to: std::net::SocketAddr) -> String {
    match to {
        _ if to.port() != 0 => to.to_string(),
        std::net::SocketAddr::V4(a) => a.ip().to_string(),
        std::net::SocketAddr::V6(a) => format!("[{}]", a.ip()),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn head(value: Option<&str>) -> Vec<u8> {
        let mut h = String::from("HTTP/1.1 200 Resolvable\r\n");
        if let Some(v) = value {
            h.push_str(&format!("X-Mcpbox-Addresses: {v}\r\n"));
        }
        h.push_str("Content-Length: 0\r\n\r\n");
        h.into_bytes()
    }

    /// A refusal of ICMP (no port) must reach the audit: the proxy parses
    /// the report's target with the one authority parser it has, which
    /// refuses port 0.
    #[test]
    fn a_refusal_without_a_port_names_the_address_the_proxy_can_parse() {
        use std::net::SocketAddr;
        for (to, want) in [
            ("192.0.2.7:0", "192.0.2.7"),
            ("[2001:db8::7]:0", "[2001:db8::7]"),
            ("192.0.2.1:443", "192.0.2.1:443"),
            ("[2001:db8::1]:443", "[2001:db8::1]:443"),
        ] {
            let to: SocketAddr = to.parse().unwrap();
            let target = refusal_target(to);
            assert_eq!(target, want);
            let (host, port) = crate::http::parse_authority(&target, 0).unwrap();
            assert_eq!((host.policy_form(), port), (to.ip().to_string(), to.port()));
        }
    }

    #[test]
    fn the_proxys_resolved_addresses_are_read_strictly() {
        let ip = |s: &str| s.parse::<Ipv4Addr>().unwrap();
        assert_eq!(resolved_addresses(&head(Some(""))), Some(vec![]));
        assert_eq!(
            resolved_addresses(&head(Some("93.184.216.34,93.184.216.35"))),
            Some(vec![ip("93.184.216.34"), ip("93.184.216.35")])
        );
        // Anything the proxy does not write is unreadable, never a guess.
        assert_eq!(resolved_addresses(&head(None)), None);
        assert_eq!(resolved_addresses(&head(Some("::1"))), None);
        assert_eq!(resolved_addresses(&head(Some("93.184.216.34,x"))), None);
        assert_eq!(resolved_addresses(&head(Some("198.18.0.7"))), None);
        let many = ["1.1.1.1"; dns::MAX_ANSWERS + 1].join(",");
        assert_eq!(resolved_addresses(&head(Some(&many))), None);
    }
}
