//! The transparent capture of a sandbox's network namespace, as netlink
//! messages built before the fork (ARCHITECTURE.md, "Transparent egress").
//!
//! Two exchanges, each sent by the init while it still holds its
//! capabilities over the namespace (root of the namespace's user
//! namespace, rootless included):
//!
//! 1. rtnetlink `RTM_NEWROUTE`: `local 0.0.0.0/0 dev lo table local`, so
//!    that every IPv4 address is the namespace's own: a `connect` to any
//!    address has a route (and a UDP datagram to one nobody listens on is
//!    answered "port unreachable" at once);
//! 2. one nfnetlink batch: table `ip mcpbox`, a `nat` chain on the
//!    `output` hook, and the rule
//!    `meta l4proto tcp ip daddr != 127.0.0.0/8 redirect to :PORT`, which
//!    sends every outbound TCP connection to the bridge's capture listener.
//! 3. rtnetlink `RTM_NEWROUTE`: `local ::/0 dev lo table local`, so that an
//!    IPv6 connection, too, is a packet (answered "refused" at once in the
//!    namespace) rather than "no route" before any packet exists; optional:
//!    a kernel or namespace without IPv6 has nothing to send it over;
//! 4. one nfnetlink batch: a `filter` chain `audit` on the `output` hook
//!    of `ip mcpbox` with
//!    `meta l4proto icmp ip daddr != 127.0.0.0/8 icmp type echo-request
//!    log group GROUP drop` and
//!    `meta l4proto != { tcp, icmp } ip daddr != 127.0.0.0/8 log group GROUP`,
//!    and table `ip6 mcpbox` with the same chain and the same two rules for
//!    ICMPv6 and `ip6 daddr != ::1`: every packet the capture does not
//!    carry (UDP but the sandbox's own resolver, anything over IPv6, an
//!    echo request) is copied to the namespace's NFLOG group, whose socket
//!    the init binds for the bridge ([`nflog_bind`]), so that each refusal
//!    is audited. An echo request is dropped as well: the local route
//!    would otherwise answer it from the namespace itself, and a ping that
//!    "works" would be a lie. Other ICMP is the kernel's own answers (the
//!    "port unreachable" that refuses a UDP datagram), neither logged nor
//!    dropped. The sandbox's user may open ping sockets (the init writes
//!    its group to `net.ipv4.ping_group_range`, which a new namespace
//!    starts closed), so that an ICMP attempt is a packet these rules see;
//!    raw sockets stay refused, for want of CAP_NET_RAW.
//!
//! The namespace has no device but `lo`, so nothing leaves it whatever
//! these say: they decide only that a connection reaches the bridge (and
//! its refusal is explicit and audited) instead of failing in the
//! namespace. Everything here is bytes with no I/O; `sys::netlink_exchange`
//! sends them. Constants from linux/netlink.h, linux/rtnetlink.h,
//! linux/netfilter/nfnetlink.h and linux/netfilter/nf_tables.h.

// netlink(7)
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_EXCL: u16 = 0x200;
const NLM_F_CREATE: u16 = 0x400;
const NLM_F_APPEND: u16 = 0x800;
const NLA_F_NESTED: u16 = 0x8000;
/// The header every message starts with (`struct nlmsghdr`).
const NLMSG_HDRLEN: usize = 16;
pub(crate) const NLMSG_ERROR: u16 = 2;

// rtnetlink(7)
const RTM_NEWROUTE: u16 = 24;
const RT_TABLE_LOCAL: u8 = 255;
const RTPROT_BOOT: u8 = 3;
const RT_SCOPE_HOST: u8 = 254;
const RTN_LOCAL: u8 = 2;
const RTA_OIF: u16 = 4;
const RTA_TABLE: u16 = 15;
/// `lo` is the first device of every network namespace.
const LOOPBACK_IFINDEX: u32 = 1;

// nfnetlink
const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
const NFNL_MSG_BATCH_END: u16 = 0x11;
const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFT_MSG_NEWTABLE: u16 = 0;
const NFT_MSG_NEWCHAIN: u16 = 3;
const NFT_MSG_NEWRULE: u16 = 6;
const NFPROTO_IPV4: u8 = 2;
const NFTA_TABLE_NAME: u16 = 1;
const NFTA_CHAIN_TABLE: u16 = 1;
const NFTA_CHAIN_NAME: u16 = 3;
const NFTA_CHAIN_HOOK: u16 = 4;
const NFTA_CHAIN_TYPE: u16 = 7;
const NFTA_HOOK_HOOKNUM: u16 = 1;
const NFTA_HOOK_PRIORITY: u16 = 2;
/// NF_INET_LOCAL_OUT: packets this namespace sends.
const NF_INET_LOCAL_OUT: u32 = 3;
/// NF_IP_PRI_NAT_DST: where destination NAT runs.
const NF_IP_PRI_NAT_DST: i32 = -100;
const NFTA_RULE_TABLE: u16 = 1;
const NFTA_RULE_CHAIN: u16 = 2;
const NFTA_RULE_EXPRESSIONS: u16 = 4;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_EXPR_NAME: u16 = 1;
const NFTA_EXPR_DATA: u16 = 2;
const NFTA_DATA_VALUE: u16 = 1;
/// The first 16-byte register (NFT_REG_1).
const NFT_REG_1: u32 = 1;
const NFTA_META_DREG: u16 = 1;
const NFTA_META_KEY: u16 = 2;
const NFT_META_L4PROTO: u32 = 16;
const NFTA_CMP_SREG: u16 = 1;
const NFTA_CMP_OP: u16 = 2;
const NFTA_CMP_DATA: u16 = 3;
const NFT_CMP_EQ: u32 = 0;
const NFT_CMP_NEQ: u32 = 1;
const NFTA_PAYLOAD_DREG: u16 = 1;
const NFTA_PAYLOAD_BASE: u16 = 2;
const NFTA_PAYLOAD_OFFSET: u16 = 3;
const NFTA_PAYLOAD_LEN: u16 = 4;
const NFT_PAYLOAD_NETWORK_HEADER: u32 = 1;
const NFT_PAYLOAD_TRANSPORT_HEADER: u32 = 2;
/// Offset of the destination address in the IPv4 header.
const IPV4_DADDR_OFFSET: u32 = 16;
const NFTA_IMMEDIATE_DREG: u16 = 1;
const NFTA_IMMEDIATE_DATA: u16 = 2;
const NFTA_REDIR_REG_PROTO_MIN: u16 = 1;
const IPPROTO_TCP: u8 = 6;
const IPPROTO_ICMP: u8 = 1;
const IPPROTO_ICMPV6: u8 = 58;
/// The type byte of an echo request: ICMP (RFC 792) and ICMPv6 (RFC 4443).
const ICMP_ECHO: u8 = 8;
const ICMPV6_ECHO_REQUEST: u8 = 128;
/// A verdict in an `immediate` expression (linux/netfilter/nf_tables.h).
const NFT_REG_VERDICT: u32 = 0;
const NFTA_DATA_VERDICT: u16 = 2;
const NFTA_VERDICT_CODE: u16 = 1;
const NF_DROP: u32 = 0;
const NFPROTO_IPV6: u8 = 10;
/// NF_IP_PRI_FILTER: where filtering runs (after the NAT above).
const NF_IP_PRI_FILTER: i32 = 0;
/// Offset of the destination address in the IPv6 header.
const IPV6_DADDR_OFFSET: u32 = 24;
const NFTA_LOG_GROUP: u16 = 1;
const NFTA_LOG_SNAPLEN: u16 = 3;
/// How much of a logged packet is copied: the IPv4 or IPv6 header and the
/// ports after it.
const LOG_SNAPLEN: u32 = 64;

// nfnetlink_log (linux/netfilter/nfnetlink_log.h)
const NFNL_SUBSYS_ULOG: u16 = 4;
const NFULNL_MSG_CONFIG: u16 = 1;
const NFULA_CFG_CMD: u16 = 1;
const NFULA_CFG_MODE: u16 = 2;
const NFULNL_CFG_CMD_BIND: u8 = 1;
const NFULNL_COPY_PACKET: u8 = 2;
/// The NFLOG group of the audit chain (per network namespace).
pub(crate) const LOG_GROUP: u16 = 31;

/// Table and chain names: what `nft list ruleset` shows inside.
const TABLE: &str = "mcpbox";
const CHAIN: &str = "capture";
const AUDIT_CHAIN: &str = "audit";

/// The netlink protocols the two exchanges use.
pub(crate) const NETLINK_ROUTE: i32 = 0;
pub(crate) const NETLINK_NETFILTER: i32 = 12;

/// One exchange: a netlink protocol, the messages (several may sit in one
/// buffer) and how many acknowledgements they ask for (the sequence
/// numbers 1..=acks each get one error-or-zero answer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Exchange {
    pub protocol: i32,
    pub bytes: Vec<u8>,
    pub acks: u32,
    /// A refusal of this exchange leaves the sandbox as it would be
    /// without it (the IPv6 route: no IPv6, no packet to refuse).
    pub optional: bool,
}

/// The exchanges that set up the capture to `port` on 127.0.0.1 and the
/// audit of what it does not carry, in order (the routes before the
/// rules that need them).
pub(crate) fn capture(port: u16) -> [Exchange; 4] {
    [
        route(libc::AF_INET as u8),
        redirect(port),
        Exchange {
            optional: true,
            ..route(libc::AF_INET6 as u8)
        },
        audit(),
    ]
}

/// The configuration that binds an NFLOG socket to [`LOG_GROUP`] with
/// [`LOG_SNAPLEN`] bytes of each packet: one message, one
/// acknowledgement. Sent on the socket that then receives the packets
/// ([`nflog_bind`]).
pub(crate) fn nflog_config() -> Exchange {
    let mut attrs = Vec::new();
    // struct nfulnl_msg_config_cmd { __u8 command; }
    attr(&mut attrs, NFULA_CFG_CMD, &[NFULNL_CFG_CMD_BIND]);
    // struct nfulnl_msg_config_mode { __be32 copy_range; __u8 copy_mode; __u8 _pad; }
    let mut mode = LOG_SNAPLEN.to_be_bytes().to_vec();
    mode.extend_from_slice(&[NFULNL_COPY_PACKET, 0]);
    attr(&mut attrs, NFULA_CFG_MODE, &mode);
    let mut bytes = Vec::new();
    message(
        &mut bytes,
        (NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_CONFIG,
        NLM_F_REQUEST | NLM_F_ACK,
        1,
        &nfgenmsg(0, LOG_GROUP),
        &attrs,
    );
    Exchange {
        protocol: NETLINK_NETFILTER,
        bytes,
        acks: 1,
        optional: false,
    }
}

/// Opens the NFLOG socket for the bridge and binds it to the audit
/// chain's group (needs the init's capabilities over the namespace, as the
/// rules do; receiving later needs none). Allocates nothing.
pub(crate) fn nflog_bind(config: &Exchange) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::AsFd;
    let sock = crate::sys::netlink_socket(config.protocol)?;
    exchange_on(sock.as_fd(), config)?;
    Ok(sock)
}

/// Sends one exchange and waits for its acknowledgements; the first
/// refusal is the error (its errno, as the kernel said it). Runs in the
/// init after the fork: it reads into a buffer on the stack and allocates
/// nothing.
pub(crate) fn run(ex: &Exchange) -> std::io::Result<()> {
    use std::os::fd::AsFd;
    let sock = crate::sys::netlink_socket(ex.protocol)?;
    exchange_on(sock.as_fd(), ex)
}

/// Sends `ex` on `sock` and waits for its acknowledgements.
fn exchange_on(sock: std::os::fd::BorrowedFd<'_>, ex: &Exchange) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    crate::sys::netlink_send(sock, &ex.bytes)?;
    let mut got = 0u32;
    let mut buf = [0u8; 4096];
    while got < ex.acks {
        let n = crate::sys::read(sock.as_raw_fd(), &mut buf)?;
        if n == 0 {
            return Err(std::io::Error::from_raw_os_error(libc::EPROTO));
        }
        let mut answers = [(0u32, 0i32); 8];
        let mut found = 0;
        acks(&buf[..n], &mut answers, &mut found);
        for (_, err) in &answers[..found] {
            if *err != 0 {
                return Err(std::io::Error::from_raw_os_error(-err));
            }
            got += 1;
        }
    }
    Ok(())
}

/// Appends one attribute (`struct nlattr`, padded to 4 bytes).
fn attr(out: &mut Vec<u8>, kind: u16, payload: &[u8]) {
    let len = 4 + payload.len();
    out.extend_from_slice(&(len as u16).to_ne_bytes());
    out.extend_from_slice(&kind.to_ne_bytes());
    out.extend_from_slice(payload);
    out.resize(out.len() + (4 - len % 4) % 4, 0);
}

/// Appends a nested attribute whose contents `inner` writes.
fn nest(out: &mut Vec<u8>, kind: u16, inner: impl FnOnce(&mut Vec<u8>)) {
    let mut body = Vec::new();
    inner(&mut body);
    attr(out, kind | NLA_F_NESTED, &body);
}

/// A NUL-terminated string attribute.
fn string(out: &mut Vec<u8>, kind: u16, s: &str) {
    let mut v = s.as_bytes().to_vec();
    v.push(0);
    attr(out, kind, &v);
}

/// A big-endian 32-bit attribute (nf_tables numbers are network order).
fn be32(out: &mut Vec<u8>, kind: u16, v: u32) {
    attr(out, kind, &v.to_be_bytes());
}

/// A `NFTA_DATA_VALUE` nested in `kind`.
fn value(out: &mut Vec<u8>, kind: u16, bytes: &[u8]) {
    nest(out, kind, |o| attr(o, NFTA_DATA_VALUE, bytes));
}

/// Appends one message: header, then the family header `fixed`, then `attrs`.
fn message(out: &mut Vec<u8>, kind: u16, flags: u16, seq: u32, fixed: &[u8], attrs: &[u8]) {
    let len = NLMSG_HDRLEN + fixed.len() + attrs.len();
    out.extend_from_slice(&(len as u32).to_ne_bytes());
    out.extend_from_slice(&kind.to_ne_bytes());
    out.extend_from_slice(&flags.to_ne_bytes());
    out.extend_from_slice(&seq.to_ne_bytes());
    // Port id 0: the kernel.
    out.extend_from_slice(&0u32.to_ne_bytes());
    out.extend_from_slice(fixed);
    out.extend_from_slice(attrs);
}

/// `struct nfgenmsg`: family, version 0, resource id (big-endian).
fn nfgenmsg(family: u8, res_id: u16) -> [u8; 4] {
    let id = res_id.to_be_bytes();
    [family, 0, id[0], id[1]]
}

/// `ip route add local 0.0.0.0/0 dev lo table local` (`family` AF_INET),
/// or `local ::/0` (AF_INET6).
fn route(family: u8) -> Exchange {
    // struct rtmsg: family, dst_len, src_len, tos, table, protocol, scope,
    // type, flags (u32).
    let mut fixed = vec![
        family,
        0,
        0,
        0,
        RT_TABLE_LOCAL,
        RTPROT_BOOT,
        RT_SCOPE_HOST,
        RTN_LOCAL,
    ];
    fixed.extend_from_slice(&0u32.to_ne_bytes());
    let mut attrs = Vec::new();
    attr(
        &mut attrs,
        RTA_TABLE,
        &u32::from(RT_TABLE_LOCAL).to_ne_bytes(),
    );
    attr(&mut attrs, RTA_OIF, &LOOPBACK_IFINDEX.to_ne_bytes());
    let mut bytes = Vec::new();
    message(
        &mut bytes,
        RTM_NEWROUTE,
        NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
        1,
        &fixed,
        &attrs,
    );
    Exchange {
        protocol: NETLINK_ROUTE,
        bytes,
        acks: 1,
        optional: false,
    }
}

/// One expression of a rule: `NFTA_LIST_ELEM { NAME, DATA { .. } }`.
fn expr(out: &mut Vec<u8>, name: &str, data: impl FnOnce(&mut Vec<u8>)) {
    nest(out, NFTA_LIST_ELEM, |o| {
        string(o, NFTA_EXPR_NAME, name);
        nest(o, NFTA_EXPR_DATA, data);
    });
}

/// `meta l4proto OP p` for each of `protocols` (one load, one comparison
/// each: with NEQ, "none of them").
fn l4proto(o: &mut Vec<u8>, op: u32, protocols: &[u8]) {
    expr(o, "meta", |d| {
        be32(d, NFTA_META_KEY, NFT_META_L4PROTO);
        be32(d, NFTA_META_DREG, NFT_REG_1);
    });
    for p in protocols {
        expr(o, "cmp", |d| {
            be32(d, NFTA_CMP_SREG, NFT_REG_1);
            be32(d, NFTA_CMP_OP, op);
            value(d, NFTA_CMP_DATA, &[*p]);
        });
    }
}

/// The first byte of the transport header (ICMP's type) `== kind`.
fn transport_first_byte_is(o: &mut Vec<u8>, kind: u8) {
    expr(o, "payload", |d| {
        be32(d, NFTA_PAYLOAD_DREG, NFT_REG_1);
        be32(d, NFTA_PAYLOAD_BASE, NFT_PAYLOAD_TRANSPORT_HEADER);
        be32(d, NFTA_PAYLOAD_OFFSET, 0);
        be32(d, NFTA_PAYLOAD_LEN, 1);
    });
    expr(o, "cmp", |d| {
        be32(d, NFTA_CMP_SREG, NFT_REG_1);
        be32(d, NFTA_CMP_OP, NFT_CMP_EQ);
        value(d, NFTA_CMP_DATA, &[kind]);
    });
}

/// The verdict `drop`.
fn drop_verdict(o: &mut Vec<u8>) {
    expr(o, "immediate", |d| {
        be32(d, NFTA_IMMEDIATE_DREG, NFT_REG_VERDICT);
        nest(d, NFTA_IMMEDIATE_DATA, |v| {
            nest(v, NFTA_DATA_VERDICT, |c| {
                be32(c, NFTA_VERDICT_CODE, NF_DROP)
            })
        });
    });
}

/// `network header[offset..offset + value.len()] != value`.
fn network_header_differs(o: &mut Vec<u8>, offset: u32, bytes: &[u8]) {
    expr(o, "payload", |d| {
        be32(d, NFTA_PAYLOAD_DREG, NFT_REG_1);
        be32(d, NFTA_PAYLOAD_BASE, NFT_PAYLOAD_NETWORK_HEADER);
        be32(d, NFTA_PAYLOAD_OFFSET, offset);
        be32(d, NFTA_PAYLOAD_LEN, bytes.len() as u32);
    });
    expr(o, "cmp", |d| {
        be32(d, NFTA_CMP_SREG, NFT_REG_1);
        be32(d, NFTA_CMP_OP, NFT_CMP_NEQ);
        value(d, NFTA_CMP_DATA, bytes);
    });
}

/// The begin (sequence 0) or end message of an nfnetlink batch.
fn batch(bytes: &mut Vec<u8>, kind: u16, seq: u32) {
    message(
        bytes,
        kind,
        NLM_F_REQUEST,
        seq,
        &nfgenmsg(0, NFNL_SUBSYS_NFTABLES),
        &[],
    );
}

/// The nf_tables message type `msg`.
fn nft(msg: u16) -> u16 {
    (NFNL_SUBSYS_NFTABLES << 8) | msg
}

/// `add table FAMILY mcpbox`.
fn new_table(bytes: &mut Vec<u8>, family: &[u8], seq: u32) {
    let mut table = Vec::new();
    string(&mut table, NFTA_TABLE_NAME, TABLE);
    message(
        bytes,
        nft(NFT_MSG_NEWTABLE),
        NLM_F_REQUEST | NLM_F_CREATE | NLM_F_ACK,
        seq,
        family,
        &table,
    );
}

/// `add chain FAMILY mcpbox NAME { type KIND hook output priority P; }`.
fn new_chain(bytes: &mut Vec<u8>, family: &[u8], seq: u32, name: &str, kind: &str, priority: i32) {
    let mut chain = Vec::new();
    string(&mut chain, NFTA_CHAIN_TABLE, TABLE);
    string(&mut chain, NFTA_CHAIN_NAME, name);
    nest(&mut chain, NFTA_CHAIN_HOOK, |o| {
        be32(o, NFTA_HOOK_HOOKNUM, NF_INET_LOCAL_OUT);
        be32(o, NFTA_HOOK_PRIORITY, priority as u32);
    });
    string(&mut chain, NFTA_CHAIN_TYPE, kind);
    message(
        bytes,
        nft(NFT_MSG_NEWCHAIN),
        NLM_F_REQUEST | NLM_F_CREATE | NLM_F_ACK,
        seq,
        family,
        &chain,
    );
}

/// `add rule FAMILY mcpbox CHAIN EXPRESSIONS`.
fn new_rule(
    bytes: &mut Vec<u8>,
    family: &[u8],
    seq: u32,
    chain: &str,
    exprs: impl FnOnce(&mut Vec<u8>),
) {
    let mut rule = Vec::new();
    string(&mut rule, NFTA_RULE_TABLE, TABLE);
    string(&mut rule, NFTA_RULE_CHAIN, chain);
    nest(&mut rule, NFTA_RULE_EXPRESSIONS, exprs);
    message(
        bytes,
        nft(NFT_MSG_NEWRULE),
        NLM_F_REQUEST | NLM_F_CREATE | NLM_F_APPEND | NLM_F_ACK,
        seq,
        family,
        &rule,
    );
}

/// The nfnetlink batch: table, chain, rule (each acknowledged), between
/// the batch's begin and end.
fn redirect(port: u16) -> Exchange {
    let ipv4 = nfgenmsg(NFPROTO_IPV4, 0);
    let mut bytes = Vec::new();
    batch(&mut bytes, NFNL_MSG_BATCH_BEGIN, 0);
    new_table(&mut bytes, &ipv4, 1);
    new_chain(&mut bytes, &ipv4, 2, CHAIN, "nat", NF_IP_PRI_NAT_DST);
    new_rule(&mut bytes, &ipv4, 3, CHAIN, |o| {
        // meta l4proto tcp
        l4proto(o, NFT_CMP_EQ, &[IPPROTO_TCP]);
        // ip daddr != 127.0.0.0/8: the first byte of the destination.
        network_header_differs(o, IPV4_DADDR_OFFSET, &[127]);
        // redirect to :port (the port in a register, network order).
        expr(o, "immediate", |d| {
            be32(d, NFTA_IMMEDIATE_DREG, NFT_REG_1);
            value(d, NFTA_IMMEDIATE_DATA, &port.to_be_bytes());
        });
        expr(o, "redir", |d| {
            be32(d, NFTA_REDIR_REG_PROTO_MIN, NFT_REG_1);
        });
    });
    batch(&mut bytes, NFNL_MSG_BATCH_END, 4);
    Exchange {
        protocol: NETLINK_NETFILTER,
        bytes,
        acks: 3,
        optional: false,
    }
}

/// The nfnetlink batch of the audit chains (4. in the module's comment):
/// in `ip mcpbox` (made by [`redirect`]) a chain and its two rules, then
/// table `ip6 mcpbox`, its chain and its two rules; seven
/// acknowledgements.
fn audit() -> Exchange {
    let ipv4 = nfgenmsg(NFPROTO_IPV4, 0);
    let ipv6 = nfgenmsg(NFPROTO_IPV6, 0);
    // log group GROUP snaplen LOG_SNAPLEN
    let log = |o: &mut Vec<u8>| {
        expr(o, "log", |d| {
            attr(d, NFTA_LOG_GROUP, &LOG_GROUP.to_be_bytes());
            be32(d, NFTA_LOG_SNAPLEN, LOG_SNAPLEN);
        });
    };
    // The destinations that stay inside: 127.0.0.0/8 (the resolver and
    // the sandbox's own services live there) and ::1.
    let not_loopback4 = |o: &mut Vec<u8>| network_header_differs(o, IPV4_DADDR_OFFSET, &[127]);
    let not_loopback6 = |o: &mut Vec<u8>| {
        network_header_differs(
            o,
            IPV6_DADDR_OFFSET,
            &std::net::Ipv6Addr::LOCALHOST.octets(),
        )
    };
    let mut bytes = Vec::new();
    batch(&mut bytes, NFNL_MSG_BATCH_BEGIN, 0);
    new_chain(
        &mut bytes,
        &ipv4,
        1,
        AUDIT_CHAIN,
        "filter",
        NF_IP_PRI_FILTER,
    );
    new_rule(&mut bytes, &ipv4, 2, AUDIT_CHAIN, |o| {
        // meta l4proto icmp ip daddr != 127.0.0.0/8 icmp type echo-request
        // log drop
        l4proto(o, NFT_CMP_EQ, &[IPPROTO_ICMP]);
        not_loopback4(o);
        transport_first_byte_is(o, ICMP_ECHO);
        log(o);
        drop_verdict(o);
    });
    new_rule(&mut bytes, &ipv4, 3, AUDIT_CHAIN, |o| {
        // meta l4proto != { tcp, icmp } (TCP is redirected to the capture
        // above; echo requests are the rule before, other ICMP is the
        // kernel's) ip daddr != 127.0.0.0/8 log
        l4proto(o, NFT_CMP_NEQ, &[IPPROTO_TCP, IPPROTO_ICMP]);
        not_loopback4(o);
        log(o);
    });
    new_table(&mut bytes, &ipv6, 4);
    new_chain(
        &mut bytes,
        &ipv6,
        5,
        AUDIT_CHAIN,
        "filter",
        NF_IP_PRI_FILTER,
    );
    new_rule(&mut bytes, &ipv6, 6, AUDIT_CHAIN, |o| {
        // meta l4proto icmpv6 ip6 daddr != ::1 icmpv6 type echo-request
        // log drop
        l4proto(o, NFT_CMP_EQ, &[IPPROTO_ICMPV6]);
        not_loopback6(o);
        transport_first_byte_is(o, ICMPV6_ECHO_REQUEST);
        log(o);
        drop_verdict(o);
    });
    new_rule(&mut bytes, &ipv6, 7, AUDIT_CHAIN, |o| {
        // meta l4proto != icmpv6 ip6 daddr != ::1 log: TCP too, which
        // the capture does not carry over IPv6
        l4proto(o, NFT_CMP_NEQ, &[IPPROTO_ICMPV6]);
        not_loopback6(o);
        log(o);
    });
    batch(&mut bytes, NFNL_MSG_BATCH_END, 8);
    Exchange {
        protocol: NETLINK_NETFILTER,
        bytes,
        acks: 7,
        optional: false,
    }
}

/// What one answer buffer says: for each `NLMSG_ERROR` message, its
/// sequence number and error (0: acknowledged). Malformed trailing bytes
/// end the walk; the caller counts what it got.
pub(crate) fn acks(buf: &[u8], out: &mut [(u32, i32)], found: &mut usize) {
    let mut off = 0;
    while off + NLMSG_HDRLEN <= buf.len() {
        let word = |at: usize| {
            let mut w = [0u8; 4];
            w.copy_from_slice(&buf[at..at + 4]);
            w
        };
        let len = u32::from_ne_bytes(word(off)) as usize;
        let kind = u16::from_ne_bytes([buf[off + 4], buf[off + 5]]);
        let seq = u32::from_ne_bytes(word(off + 8));
        if len < NLMSG_HDRLEN || off + len > buf.len() {
            return;
        }
        if kind == NLMSG_ERROR && len >= NLMSG_HDRLEN + 4 && *found < out.len() {
            let err = i32::from_ne_bytes(word(off + NLMSG_HDRLEN));
            out[*found] = (seq, err);
            *found += 1;
        }
        off += (len + 3) & !3;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// The batch, byte for byte, as a Python prototype built it that the
    /// kernel accepted and that captured a connection (as root and
    /// rootless, kernel 6.18, during issue 31): a change here changes what
    /// the kernel is asked.
    const ACCEPTED_BATCH_3129: &[&str] = &[
        "140000001000010000000000000000000000000a20000000000a050401000000",
        "00000000020000000b0001006d6370626f78000048000000030a050402000000",
        "00000000020000000b0001006d6370626f7800000c0003006361707475726500",
        "14000480080001000000000308000200ffffff9c080007006e61740028010000",
        "060a050c0300000000000000020000000b0001006d6370626f7800000c000200",
        "6361707475726500fc00048024000180090001006d6574610000000014000280",
        "080002000000001008000100000000012c00018008000100636d700020000280",
        "080001000000000108000200000000000c000380050001000600000034000180",
        "0c0001007061796c6f6164002400028008000100000000010800020000000001",
        "080003000000001008000400000000012c00018008000100636d700020000280",
        "080001000000000108000200000000010c000380050001007f0000002c000180",
        "0e000100696d6d6564696174650000001800028008000100000000010c000280",
        "060001000c3900001c0001800a00010072656469720000000c00028008000100",
        "00000001140000001100010004000000000000000000000a",
    ];

    #[test]
    fn the_redirect_batch_is_the_one_the_kernel_accepted() {
        let ex = redirect(3129);
        assert_eq!(ex.protocol, NETLINK_NETFILTER);
        assert_eq!(ex.acks, 3);
        let hex: String = ex.bytes.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, ACCEPTED_BATCH_3129.concat());
        let mut kinds = Vec::new();
        let mut off = 0;
        while off < ex.bytes.len() {
            let len = u32::from_ne_bytes(ex.bytes[off..off + 4].try_into().unwrap()) as usize;
            kinds.push(u16::from_ne_bytes([ex.bytes[off + 4], ex.bytes[off + 5]]));
            assert_eq!(len % 4, 0, "messages stay aligned");
            off += len;
        }
        assert_eq!(off, ex.bytes.len());
        assert_eq!(kinds, vec![0x10, 0x0a00, 0x0a03, 0x0a06, 0x11]);
        // Another port changes only the immediate's value (network order).
        let other = redirect(8080);
        let diff: Vec<usize> = (0..ex.bytes.len())
            .filter(|&i| ex.bytes[i] != other.bytes[i])
            .collect();
        assert_eq!(diff.len(), 2, "{diff:?}");
    }

    /// The audit batch: begin, chain and rule in `ip mcpbox`, then table,
    /// chain and rule in `ip6 mcpbox`, end; five acknowledgements, both
    /// rules ending in `log` to the group the bridge's socket binds. (The
    /// kernel's acceptance is shown end to end: egress_transparent.rs's
    /// attack test finds the refused UDP and IPv6 packets in the audit.)
    #[test]
    fn the_audit_batch_logs_to_the_group_the_bridge_binds() {
        let ex = audit();
        assert_eq!(
            (ex.protocol, ex.acks, ex.optional),
            (NETLINK_NETFILTER, 7, false)
        );
        let mut kinds = Vec::new();
        let mut families = Vec::new();
        let mut off = 0;
        while off < ex.bytes.len() {
            let len = u32::from_ne_bytes(ex.bytes[off..off + 4].try_into().unwrap()) as usize;
            kinds.push(u16::from_ne_bytes([ex.bytes[off + 4], ex.bytes[off + 5]]));
            families.push(ex.bytes[off + 16]);
            assert_eq!(len % 4, 0, "messages stay aligned");
            off += len;
        }
        assert_eq!(off, ex.bytes.len());
        assert_eq!(
            kinds,
            vec![0x10, 0x0a03, 0x0a06, 0x0a06, 0x0a00, 0x0a03, 0x0a06, 0x0a06, 0x11]
        );
        assert_eq!(&families[1..8], &[2, 2, 2, 10, 10, 10, 10]);
        let hex: String = ex.bytes.iter().map(|b| format!("{b:02x}")).collect();
        let log = "6c6f67"; // "log"
        assert_eq!(hex.matches(log).count(), 4, "{hex}");
        // Two drops, each the verdict NF_DROP (0) in NFTA_VERDICT_CODE,
        // nested in NFTA_DATA_VERDICT, nested in NFTA_IMMEDIATE_DATA.
        let drop = "100002800c0002800800010000000000";
        assert_eq!(hex.matches(drop).count(), 2, "{hex}");
        // The config binds the same group, copying packets.
        let cfg = nflog_config();
        assert_eq!(&cfg.bytes[16..20], &[0, 0, 0, 31]);
        assert_eq!(u16::from_ne_bytes([cfg.bytes[4], cfg.bytes[5]]), 0x0401);
        let [route4, _, route6, _] = capture(3129);
        assert!(!route4.optional && route6.optional);
        assert_eq!(route6.bytes[16], libc::AF_INET6 as u8);
    }

    #[test]
    fn the_route_is_local_scope_host_in_table_local_on_lo() {
        let ex = route(libc::AF_INET as u8);
        assert_eq!(ex.protocol, NETLINK_ROUTE);
        let b = &ex.bytes;
        assert_eq!(
            u32::from_ne_bytes(b[0..4].try_into().unwrap()) as usize,
            b.len()
        );
        assert_eq!(u16::from_ne_bytes([b[4], b[5]]), RTM_NEWROUTE);
        assert_eq!(&b[16..24], &[2, 0, 0, 0, 255, 3, 254, 2]);
    }

    #[test]
    fn acks_are_read_and_garbage_ends_the_walk() {
        let mut buf = Vec::new();
        message(&mut buf, NLMSG_ERROR, 0, 2, &0i32.to_ne_bytes(), &[0; 16]);
        message(
            &mut buf,
            NLMSG_ERROR,
            0,
            3,
            &(-1i32).to_ne_bytes(),
            &[0; 16],
        );
        buf.extend_from_slice(&[0xff; 7]);
        let mut out = [(0, 0); 4];
        let mut n = 0;
        acks(&buf, &mut out, &mut n);
        assert_eq!(&out[..n], &[(2, 0), (3, -1)]);
        let mut n = 0;
        acks(&[0u8; 3], &mut out, &mut n);
        assert_eq!(n, 0);
        // A length that points past the end is not followed.
        let mut bad = buf.clone();
        bad[0..4].copy_from_slice(&4096u32.to_ne_bytes());
        let mut n = 0;
        acks(&bad, &mut out, &mut n);
        assert_eq!(n, 0);
    }
}
