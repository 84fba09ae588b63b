//! Digests over canonical JSON, used for argument digests and tool pins.

use serde_json::Value;
use sha2::{Digest, Sha256};

/// Canonical JSON (object keys sorted by their UTF-8 bytes, no
/// insignificant whitespace), the same form the audit log hashes.
pub use mcpbox_audit::canonical_json;

/// Lowercase hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    mcpbox_policy::hex::encode(&digest)
}

/// Lowercase hex SHA-256 of the canonical JSON of `value`.
pub fn json_digest(value: &Value) -> String {
    sha256_hex(canonical_json(value).as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_json_sorts_keys_at_every_level() {
        let v: Value =
            serde_json::from_str(r#"{"b":1,"a":{"d":[{"z":1,"y":2}],"c":"x"}}"#).unwrap();
        assert_eq!(
            canonical_json(&v),
            r#"{"a":{"c":"x","d":[{"y":2,"z":1}]},"b":1}"#
        );
    }

    #[test]
    fn digest_ignores_key_order() {
        let a: Value = serde_json::from_str(r#"{"x":1,"y":"two"}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{ "y" : "two", "x" : 1 }"#).unwrap();
        assert_eq!(json_digest(&a), json_digest(&b));
    }
}
