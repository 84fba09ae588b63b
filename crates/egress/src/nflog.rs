//! The packets the sandbox sent that the capture does not carry (UDP other
//! than its own resolver, anything over IPv6, echo requests), as the namespace's NFLOG
//! group delivers them to the bridge (the nftables `log` rules of
//! `mcpbox-sandbox`'s netns.rs): bytes in, one [`NotCarried`] per packet
//! out, no I/O. The kernel refuses each of them inside the namespace (a
//! local route and no listener: "connection refused"; an echo request is
//! dropped by the rule that logs it); the bridge reports
//! them so that each refusal is audited.
//!
//! Formats: netlink(7) message headers, `struct nfgenmsg`, the NFULA_*
//! attributes of linux/netfilter/nfnetlink_log.h (only NFULA_PAYLOAD is
//! read), and the IPv4 (RFC 791) and IPv6 (RFC 8200) headers at the start
//! of that payload. Anything shorter than it claims ends the walk.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// `(NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_PACKET`.
const NFLOG_PACKET: u16 = 4 << 8;
const NFULA_PAYLOAD: u16 = 9;
const NLMSG_HDRLEN: usize = 16;
const NFGENMSG_LEN: usize = 4;
/// The attribute type without its flag bits (NLA_TYPE_MASK).
const NLA_TYPE_MASK: u16 = 0x3fff;

/// One refused packet: its protocol (IANA number: 17 UDP, 6 TCP, 58
/// ICMPv6, ...) and where it was going (port 0 for a protocol without
/// ports).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NotCarried {
    pub protocol: u8,
    pub to: SocketAddr,
}

impl NotCarried {
    /// The protocol's name for the audit record.
    pub fn protocol_name(&self) -> String {
        match (self.protocol, self.to.is_ipv6()) {
            (17, false) => "udp".into(),
            (17, true) => "udp6".into(),
            (6, true) => "tcp6".into(),
            (6, false) => "tcp".into(),
            (1, _) => "icmp".into(),
            (58, _) => "icmp6".into(),
            (n, _) => format!("ip-proto-{n}"),
        }
    }
}

/// Every packet in one buffer read from the NFLOG socket.
pub fn packets(buf: &[u8]) -> Vec<NotCarried> {
    let mut out = Vec::new();
    let mut off = 0;
    while off + NLMSG_HDRLEN <= buf.len() {
        let len = u32_ne(&buf[off..off + 4]) as usize;
        let kind = u16::from_ne_bytes([buf[off + 4], buf[off + 5]]);
        if len < NLMSG_HDRLEN || off + len > buf.len() {
            break;
        }
        if kind == NFLOG_PACKET && len >= NLMSG_HDRLEN + NFGENMSG_LEN {
            let attrs = &buf[off + NLMSG_HDRLEN + NFGENMSG_LEN..off + len];
            if let Some(p) = payload(attrs).and_then(parse_ip) {
                out.push(p);
            }
        }
        off += (len + 3) & !3;
    }
    out
}

fn u32_ne(b: &[u8]) -> u32 {
    u32::from_ne_bytes([b[0], b[1], b[2], b[3]])
}

/// The NFULA_PAYLOAD attribute's bytes.
fn payload(mut attrs: &[u8]) -> Option<&[u8]> {
    while attrs.len() >= 4 {
        let len = usize::from(u16::from_ne_bytes([attrs[0], attrs[1]]));
        let kind = u16::from_ne_bytes([attrs[2], attrs[3]]) & NLA_TYPE_MASK;
        if len < 4 || len > attrs.len() {
            return None;
        }
        if kind == NFULA_PAYLOAD {
            return Some(&attrs[4..len]);
        }
        let next = (len + 3) & !3;
        attrs = attrs.get(next..)?;
    }
    None
}

/// The protocol and destination of an IPv4 or IPv6 packet.
fn parse_ip(p: &[u8]) -> Option<NotCarried> {
    let version = p.first()? >> 4;
    let (protocol, ip, transport): (u8, IpAddr, &[u8]) = match version {
        4 => {
            let ihl = usize::from(p[0] & 0x0f) * 4;
            let dst: [u8; 4] = p.get(16..20)?.try_into().ok()?;
            (*p.get(9)?, Ipv4Addr::from(dst).into(), p.get(ihl..)?)
        }
        6 => {
            // The next header right after the fixed header; extension
            // headers are reported as their own protocol number.
            let dst: [u8; 16] = p.get(24..40)?.try_into().ok()?;
            (*p.get(6)?, Ipv6Addr::from(dst).into(), p.get(40..)?)
        }
        _ => return None,
    };
    // UDP (17), TCP (6), SCTP (132), UDP-Lite (136): the destination port
    // is the second 16-bit word.
    let port = match protocol {
        6 | 17 | 132 | 136 => u16::from_be_bytes([*transport.get(2)?, *transport.get(3)?]),
        _ => 0,
    };
    Some(NotCarried {
        protocol,
        to: SocketAddr::new(ip, port),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// One NFULNL_MSG_PACKET message carrying `packet` as its payload,
    /// after another attribute (as the kernel sends the packet header
    /// first).
    fn message(packet: &[u8]) -> Vec<u8> {
        let mut attrs = Vec::new();
        // NFULA_PACKET_HDR (1): hw_protocol, hook, pad
        attrs.extend_from_slice(&8u16.to_ne_bytes());
        attrs.extend_from_slice(&1u16.to_ne_bytes());
        attrs.extend_from_slice(&[0x08, 0x00, 3, 0]);
        let len = 4 + packet.len();
        attrs.extend_from_slice(&(len as u16).to_ne_bytes());
        attrs.extend_from_slice(&NFULA_PAYLOAD.to_ne_bytes());
        attrs.extend_from_slice(packet);
        attrs.resize(attrs.len() + (4 - len % 4) % 4, 0);
        let total = NLMSG_HDRLEN + NFGENMSG_LEN + attrs.len();
        let mut m = Vec::new();
        m.extend_from_slice(&(total as u32).to_ne_bytes());
        m.extend_from_slice(&NFLOG_PACKET.to_ne_bytes());
        m.extend_from_slice(&[0; 10]);
        m.extend_from_slice(&[2, 0, 0, 31]);
        m.extend_from_slice(&attrs);
        m
    }

    fn udp4(dst: [u8; 4], port: u16) -> Vec<u8> {
        let mut p = vec![0x45, 0, 0, 28, 0, 0, 0, 0, 64, 17, 0, 0, 127, 0, 0, 1];
        p.extend_from_slice(&dst);
        p.extend_from_slice(&[0x9c, 0x40]);
        p.extend_from_slice(&port.to_be_bytes());
        p.extend_from_slice(&[0, 8, 0, 0]);
        p
    }

    fn tcp6(dst: Ipv6Addr, port: u16) -> Vec<u8> {
        let mut p = vec![0x60, 0, 0, 0, 0, 20, 6, 64];
        p.extend_from_slice(&Ipv6Addr::LOCALHOST.octets());
        p.extend_from_slice(&dst.octets());
        p.extend_from_slice(&[0x9c, 0x40]);
        p.extend_from_slice(&port.to_be_bytes());
        p
    }

    #[test]
    fn udp_and_ipv6_packets_are_read_with_their_destination() {
        let mut buf = message(&udp4([192, 0, 2, 53], 53));
        let v6: Ipv6Addr = "2001:db8::1".parse().unwrap();
        buf.extend(message(&tcp6(v6, 443)));
        let got = packets(&buf);
        assert_eq!(
            got,
            vec![
                NotCarried {
                    protocol: 17,
                    to: "192.0.2.53:53".parse().unwrap()
                },
                NotCarried {
                    protocol: 6,
                    to: SocketAddr::new(v6.into(), 443)
                },
            ]
        );
        assert_eq!(got[0].protocol_name(), "udp");
        assert_eq!(got[1].protocol_name(), "tcp6");
    }

    /// Every prefix and every single-byte change of a valid buffer parses
    /// without panicking.
    #[test]
    fn truncated_and_mutated_buffers_never_panic() {
        let base = message(&udp4([192, 0, 2, 1], 443));
        crate::mutations(&base, 20_000, |m| {
            let _ = packets(m);
        });
    }
}
