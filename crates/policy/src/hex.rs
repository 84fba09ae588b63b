//! Lowercase hex, the one encoder and decoder of the workspace (digests,
//! ids, salts, sandbox names). It sits in the policy crate because every
//! crate that needs it already depends on this one.

const DIGITS: &[u8; 16] = b"0123456789abcdef";

/// `bytes` as lowercase hex, two digits a byte.
pub fn encode(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    s
}

/// The value of one hex digit (either case), `None` for anything else.
pub fn digit(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

/// The bytes of an even-length string of hex digits (either case); `None`
/// for an odd length or any other character.
pub fn decode(s: &str) -> Option<Vec<u8>> {
    let b = s.as_bytes();
    if !b.len().is_multiple_of(2) {
        return None;
    }
    b.chunks_exact(2)
        .map(|p| Some(digit(p[0])? << 4 | digit(p[1])?))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encode_is_lowercase_two_digits_a_byte() {
        assert_eq!(encode(&[]), "");
        assert_eq!(encode(&[0, 0x0f, 0xa5, 0xff]), "000fa5ff");
    }

    #[test]
    fn decode_reads_what_encode_writes_and_refuses_the_rest() {
        let all: Vec<u8> = (0..=255).collect();
        assert_eq!(decode(&encode(&all)), Some(all));
        assert_eq!(decode("A5ff"), Some(vec![0xa5, 0xff]));
        assert_eq!(decode("abc"), None);
        assert_eq!(decode("0g"), None);
        assert_eq!(decode("+1"), None, "from_str_radix would take a sign");
        assert_eq!(decode("é0"), None);
    }

    #[test]
    fn digit_takes_both_cases_and_nothing_else() {
        assert_eq!(digit(b'7'), Some(7));
        assert_eq!(digit(b'b'), Some(11));
        assert_eq!(digit(b'F'), Some(15));
        assert_eq!(digit(b'g'), None);
        assert_eq!(digit(b'%'), None);
    }
}
