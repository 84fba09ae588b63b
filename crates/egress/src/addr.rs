//! The address guard: which resolved addresses the proxy refuses to reach,
//! even for an allowed name, so that DNS rebinding or a hostile DNS answer
//! cannot point an allowed name inside (loopback, the LAN, the cloud metadata
//! service). See SSRF write-ups such as CVE-2019-4142 / the Capital One
//! metadata incident for why metadata endpoints are singled out.

use mcpbox_policy::Reason;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Why an address is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressClass {
    /// 127.0.0.0/8, ::1.
    Loopback,
    /// RFC 1918, CGNAT 100.64.0.0/10, unique-local fc00::/7.
    Private,
    /// 169.254.0.0/16, fe80::/10.
    LinkLocal,
    /// 224.0.0.0/4, ff00::/8.
    Multicast,
    /// 0.0.0.0/8, :: (Linux connects 0.0.0.0 to the local host).
    Unspecified,
    /// 255.255.255.255.
    Broadcast,
    /// Documentation and benchmarking ranges (TEST-NET-1..3, 198.18.0.0/15,
    /// 2001:db8::/32, 3fff::/20, 2001:2::/48).
    Documentation,
    /// Anything else that is not public unicast: 240.0.0.0/4, 192.0.0.0/24,
    /// the 6to4 relay anycast, Teredo, ORCHID, discard-only, site-local,
    /// IPv4-compatible and anything outside 2000::/3.
    Reserved,
    /// A cloud metadata endpoint (169.254.169.254, fd00:ec2::254,
    /// 100.100.100.200, ...).
    Metadata,
}

impl AddressClass {
    /// The machine-readable reason code used in the 403 header and the audit.
    pub fn reason(self) -> Reason {
        match self {
            Self::Loopback => Reason::NetworkLoopbackAddress,
            Self::Private => Reason::NetworkPrivateAddress,
            Self::LinkLocal => Reason::NetworkLinkLocalAddress,
            Self::Multicast => Reason::NetworkMulticastAddress,
            Self::Unspecified => Reason::NetworkUnspecifiedAddress,
            Self::Broadcast => Reason::NetworkBroadcastAddress,
            Self::Documentation => Reason::NetworkDocumentationAddress,
            Self::Reserved => Reason::NetworkReservedAddress,
            Self::Metadata => Reason::NetworkMetadataEndpoint,
        }
    }

    /// A short human description for the 403 body.
    pub fn describe(self) -> &'static str {
        match self {
            Self::Loopback => "a loopback address",
            Self::Private => "a private network address",
            Self::LinkLocal => "a link-local address",
            Self::Multicast => "a multicast address",
            Self::Unspecified => "the unspecified address",
            Self::Broadcast => "the broadcast address",
            Self::Documentation => "a documentation or benchmarking address",
            Self::Reserved => "a reserved, non-public address",
            Self::Metadata => "a cloud metadata endpoint",
        }
    }

    /// Whether an explicit `[network.hosts]` mapping may still point here.
    /// A mapping is a deliberate exception for an internal service, so it
    /// passes loopback and private ranges, but never the metadata service or
    /// addresses that cannot name one service.
    pub fn allowed_for_mapping(self) -> bool {
        !matches!(
            self,
            Self::Metadata | Self::Multicast | Self::Unspecified | Self::Broadcast
        )
    }
}

/// Cloud metadata endpoints (AWS/GCP/Azure/OpenStack, AWS ECS task metadata,
/// Alibaba, old Oracle Cloud).
const METADATA_V4: [Ipv4Addr; 4] = [
    Ipv4Addr::new(169, 254, 169, 254),
    Ipv4Addr::new(169, 254, 170, 2),
    Ipv4Addr::new(100, 100, 100, 200),
    Ipv4Addr::new(192, 0, 0, 192),
];

/// IPv6 metadata endpoints: AWS (fd00:ec2::254) and GCP (fd20:ce::254).
const METADATA_V6: [Ipv6Addr; 2] = [
    Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254),
    Ipv6Addr::new(0xfd20, 0xce, 0, 0, 0, 0, 0, 0x254),
];

/// Names of metadata services, refused before any policy or resolution.
const METADATA_NAMES: [&str; 8] = [
    "metadata",
    "metadata.google.internal",
    "metadata.goog",
    "instance-data",
    "instance-data.ec2.internal",
    "metadata.azure.internal",
    "metadata.tencentyun.com",
    "metadata.platformequinix.com",
];

/// Whether `host` (lowercase, no trailing dot) names a cloud metadata service.
pub fn is_metadata_name(host: &str) -> bool {
    METADATA_NAMES.contains(&host)
}

/// `None` for a public unicast address the proxy may reach; otherwise why not.
pub fn classify(ip: IpAddr) -> Option<AddressClass> {
    match ip {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => classify_v6(v6),
    }
}

fn classify_v4(ip: Ipv4Addr) -> Option<AddressClass> {
    use AddressClass::*;
    if METADATA_V4.contains(&ip) {
        return Some(Metadata);
    }
    let o = ip.octets();
    if ip == Ipv4Addr::BROADCAST {
        return Some(Broadcast);
    }
    let class = match o {
        [0, ..] => Unspecified,
        [127, ..] => Loopback,
        [10, ..] => Private,
        [172, b, ..] if b & 0xf0 == 16 => Private,
        [192, 168, ..] => Private,
        [100, b, ..] if b & 0xc0 == 64 => Private,
        [169, 254, ..] => LinkLocal,
        [192, 0, 0, _] => Reserved,
        [192, 0, 2, _] | [198, 51, 100, _] | [203, 0, 113, _] => Documentation,
        [198, b, ..] if b & 0xfe == 18 => Documentation,
        [192, 88, 99, _] => Reserved,
        [224..=239, ..] => Multicast,
        [240..=255, ..] => Reserved,
        _ => return None,
    };
    Some(class)
}

fn embedded_v4(hi: u16, lo: u16) -> Ipv4Addr {
    let [a, b] = hi.to_be_bytes();
    let [c, d] = lo.to_be_bytes();
    Ipv4Addr::new(a, b, c, d)
}

fn classify_v6(ip: Ipv6Addr) -> Option<AddressClass> {
    use AddressClass::*;
    if METADATA_V6.contains(&ip) {
        return Some(Metadata);
    }
    if ip.is_unspecified() {
        return Some(Unspecified);
    }
    if ip.is_loopback() {
        return Some(Loopback);
    }
    let s = ip.segments();
    // ::ffff:a.b.c.d, IPv4-mapped: the kernel connects to the IPv4 address.
    if s[..5] == [0; 5] && s[5] == 0xffff {
        return classify_v4(embedded_v4(s[6], s[7]));
    }
    // ::a.b.c.d (IPv4-compatible, deprecated) and the rest of ::/80.
    if s[..5] == [0; 5] {
        return Some(classify_v4(embedded_v4(s[6], s[7])).unwrap_or(Reserved));
    }
    // NAT64 well-known prefix 64:ff9b::/96: reaches the embedded IPv4 address.
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return classify_v4(embedded_v4(s[6], s[7]));
    }
    // 64:ff9b:1::/48, local-use NAT64 (RFC 8215): translator-specific.
    if s[0] == 0x64 && s[1] == 0xff9b && s[2] == 1 {
        return Some(Reserved);
    }
    // 6to4 2002::/16 carries an IPv4 address in bits 16..48.
    if s[0] == 0x2002 {
        return Some(classify_v4(embedded_v4(s[1], s[2])).unwrap_or(Reserved));
    }
    if s[0] == 0x2001 {
        match s[1] {
            0 => return Some(Reserved),                   // Teredo 2001::/32
            0xdb8 => return Some(Documentation),          // 2001:db8::/32
            2 if s[2] == 0 => return Some(Documentation), // benchmarking 2001:2::/48
            0x10..=0x2f => return Some(Reserved),         // ORCHID / ORCHIDv2
            _ => {}
        }
    }
    if s[0] == 0x3fff && s[1] & 0xf000 == 0 {
        return Some(Documentation); // 3fff::/20 (RFC 9637)
    }
    if s[0] & 0xfe00 == 0xfc00 {
        return Some(Private);
    }
    if s[0] & 0xffc0 == 0xfe80 {
        return Some(LinkLocal);
    }
    if s[0] & 0xff00 == 0xff00 {
        return Some(Multicast);
    }
    // Only 2000::/3 is allocated global unicast; everything else (discard
    // 100::/64, site-local fec0::/10, unallocated) is refused.
    if s[0] & 0xe000 != 0x2000 {
        return Some(Reserved);
    }
    None
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn class(s: &str) -> Option<AddressClass> {
        classify(s.parse().unwrap())
    }

    #[test]
    fn public_addresses_pass() {
        for a in [
            "1.1.1.1",
            "8.8.8.8",
            "93.184.215.14",
            "2606:4700::1111",
            "64:ff9b::808:808",
        ] {
            assert_eq!(class(a), None, "{a}");
        }
    }

    #[test]
    fn inside_addresses_are_refused_in_every_spelling() {
        use AddressClass::*;
        let cases = [
            ("127.0.0.1", Loopback),
            ("127.255.1.2", Loopback),
            ("::1", Loopback),
            ("::ffff:127.0.0.1", Loopback),
            ("::127.0.0.1", Loopback),
            ("64:ff9b::7f00:1", Loopback),
            ("2002:7f00:1::", Loopback),
            ("10.1.2.3", Private),
            ("172.16.0.1", Private),
            ("172.31.255.255", Private),
            ("192.168.1.1", Private),
            ("100.64.0.1", Private),
            ("100.127.255.255", Private),
            ("fd12::1", Private),
            ("fc00::1", Private),
            ("::ffff:10.0.0.1", Private),
            ("2002:c0a8:101::1", Private),
            ("169.254.1.1", LinkLocal),
            ("fe80::1", LinkLocal),
            ("169.254.169.254", Metadata),
            ("::ffff:169.254.169.254", Metadata),
            ("64:ff9b::a9fe:a9fe", Metadata),
            ("fd00:ec2::254", Metadata),
            ("100.100.100.200", Metadata),
            ("224.0.0.1", Multicast),
            ("ff02::1", Multicast),
            ("0.0.0.0", Unspecified),
            ("0.1.2.3", Unspecified),
            ("::", Unspecified),
            ("255.255.255.255", Broadcast),
            ("192.0.2.1", Documentation),
            ("198.51.100.7", Documentation),
            ("203.0.113.9", Documentation),
            ("198.18.0.1", Documentation),
            ("198.19.255.1", Documentation),
            ("2001:db8::1", Documentation),
            ("3fff::1", Documentation),
            ("240.0.0.1", Reserved),
            ("192.0.0.8", Reserved),
            ("2001::1", Reserved),
            ("fec0::1", Reserved),
            ("100::1", Reserved),
            ("::2.2.2.2", Reserved),
            ("64:ff9b:1::1", Reserved),
        ];
        for (a, want) in cases {
            assert_eq!(class(a), Some(want), "{a}");
        }
    }

    #[test]
    fn boundaries_of_private_ranges_are_exact() {
        assert_eq!(class("172.15.255.255"), None);
        assert_eq!(class("172.32.0.0"), None);
        assert_eq!(class("100.63.255.255"), None);
        assert_eq!(class("100.128.0.0"), None);
        assert_eq!(class("198.20.0.0"), None);
    }

    #[test]
    fn mapping_never_reaches_metadata() {
        assert!(!AddressClass::Metadata.allowed_for_mapping());
        assert!(AddressClass::Loopback.allowed_for_mapping());
        assert!(AddressClass::Private.allowed_for_mapping());
    }

    #[test]
    fn metadata_names_are_recognised() {
        assert!(is_metadata_name("metadata.google.internal"));
        assert!(is_metadata_name("metadata"));
        assert!(!is_metadata_name("example.com"));
    }
}
