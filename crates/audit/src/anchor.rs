//! The chain head's MAC: what makes a truncated log show.
//!
//! The hash chain catches an edited, deleted or reordered row, but not a
//! log whose newest rows were deleted and whose stored head was rewritten
//! to the new last row: that is again a valid chain. So every write also
//! stores `HMAC-SHA256(key, seq, head hash)` (RFC 2104) beside the head,
//! with a key kept outside the database (the state directory's
//! `audit.key`, 0600, which the sandboxed server never sees). Rewriting the
//! head then needs the key; [`crate::SqliteStore::verify_with`] checks it.
//!
//! What it does not catch: the whole database put back as an older copy
//! (its MAC is valid for its own head). Keep [`crate::VerifyReport`]'s head
//! elsewhere, or a JSON Lines copy, for that.

use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;

use ring::hmac;

use crate::{Error, Result};
use mcpbox_policy::hex::encode as hex;

/// Bytes of key material.
const KEY_LEN: usize = 32;

/// The key of the head's MAC.
pub struct HeadKey {
    key: hmac::Key,
    /// [`HeadKey::id`], computed once: every signed write names it.
    id: String,
}

impl std::fmt::Debug for HeadKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HeadKey(..)")
    }
}

impl HeadKey {
    /// A key from its bytes (tests, and a key file's contents).
    pub fn from_bytes(bytes: &[u8]) -> HeadKey {
        let key = hmac::Key::new(hmac::HMAC_SHA256, bytes);
        let id = hex(&hmac::sign(&key, b"mcpbox-audit-key-id").as_ref()[..8]);
        HeadKey { key, id }
    }

    /// Reads the key at `path` (64 hex digits).
    pub fn load(path: &Path) -> Result<HeadKey> {
        let mut text = String::new();
        std::fs::File::open(path)
            .and_then(|mut f| f.read_to_string(&mut text))
            .map_err(Error::io("read the audit key", path))?;
        let bytes = mcpbox_policy::hex::decode(text.trim())
            .filter(|b| b.len() == KEY_LEN)
            .ok_or_else(|| Error::BadKey {
                path: path.to_path_buf(),
                what: "not 64 hex digits",
            })?;
        Ok(HeadKey::from_bytes(&bytes))
    }

    /// Reads the key at `path`, creating it (0600, from the system's random
    /// source) when there is none. Two processes creating it at once agree:
    /// the file appears whole or not at all (written aside, then linked in
    /// place without replacing), and the loser reads the winner's.
    pub fn load_or_create(path: &Path) -> Result<HeadKey> {
        match HeadKey::load(path) {
            Ok(k) => return Ok(k),
            Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let mut bytes = [0u8; KEY_LEN];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes).map_err(
            |_| Error::Io {
                step: "draw the audit key for",
                path: path.to_path_buf(),
                source: std::io::Error::other("the system random source failed"),
            },
        )?;
        let dir = path.parent().unwrap_or(Path::new("."));
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(Error::io("create dir", dir))?;
        let aside = dir.join(format!(
            ".audit.key.{}.{}",
            std::process::id(),
            hex(&bytes[..4])
        ));
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&aside)
            .and_then(|mut f| {
                f.write_all(hex(&bytes).as_bytes())?;
                f.sync_all()
            });
        if let Err(e) = written {
            let _ = std::fs::remove_file(&aside);
            return Err(Error::io("write the audit key", &aside)(e));
        }
        // link(2) never replaces: the first key to land is the key
        let linked = std::fs::hard_link(&aside, path);
        let _ = std::fs::remove_file(&aside);
        match linked {
            Ok(()) => Ok(HeadKey::from_bytes(&bytes)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => HeadKey::load(path),
            Err(e) => Err(Error::io("install the audit key", path)(e)),
        }
    }

    /// Which key this is, without saying anything of it: 16 hex digits of
    /// its MAC of a fixed label. Stored with each signature, so that a log
    /// verified with another key says so instead of "forged".
    pub fn id(&self) -> String {
        self.id.clone()
    }

    /// The head's signature as stored: `KEYID:MAC`, hex.
    pub fn mac(&self, seq: i64, hash: &str) -> String {
        let tag = hmac::sign(&self.key, &message(seq, hash));
        format!("{}:{}", self.id, hex(tag.as_ref()))
    }

    /// What a stored signature says of the head, the MAC compared in
    /// constant time.
    pub fn check(&self, seq: i64, hash: &str, stored: &str) -> Signature {
        let Some((id, mac)) = stored.split_once(':') else {
            return Signature::Forged;
        };
        if id != self.id {
            return Signature::OtherKey(id.chars().take(16).collect());
        }
        match mcpbox_policy::hex::decode(mac) {
            Some(tag) if hmac::verify(&self.key, &message(seq, hash), &tag).is_ok() => {
                Signature::Valid
            }
            _ => Signature::Forged,
        }
    }

    /// Whether `stored` is this key's valid signature of the head.
    pub fn verify(&self, seq: i64, hash: &str, stored: &str) -> bool {
        self.check(seq, hash, stored) == Signature::Valid
    }
}

/// What a head's stored signature says, checked with one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Signature {
    /// This key's, and the head's.
    Valid,
    /// This key's id, but not the head's MAC: the head was rewritten.
    Forged,
    /// Made with another key (its id): checking needs that key.
    OtherKey(String),
}

/// What the MAC covers: a label, the seq and the head hash, unambiguous.
fn message(seq: i64, hash: &str) -> Vec<u8> {
    format!("mcpbox-audit-head\0{seq}\0{hash}").into_bytes()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_mac_binds_seq_and_hash() {
        let k = HeadKey::from_bytes(&[7; 32]);
        let m = k.mac(3, "ab");
        assert!(k.verify(3, "ab", &m));
        assert!(!k.verify(2, "ab", &m));
        assert!(!k.verify(3, "ac", &m));
        assert!(!k.verify(3, "ab", "zz"));
        let other = HeadKey::from_bytes(&[8; 32]);
        assert!(!other.verify(3, "ab", &m));
        assert_eq!(
            other.check(3, "ab", &m),
            Signature::OtherKey(k.id()),
            "another key is named as such, not as a forgery"
        );
        assert_eq!(k.check(3, "ab", "no-colon"), Signature::Forged);
    }

    #[test]
    fn a_key_is_created_once_private_and_read_back() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("state/audit.key");
        let a = HeadKey::load_or_create(&p).unwrap();
        let mode = std::fs::metadata(&p).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let b = HeadKey::load_or_create(&p).unwrap();
        assert_eq!(a.mac(1, "h"), b.mac(1, "h"));
        // nothing left aside
        assert_eq!(std::fs::read_dir(p.parent().unwrap()).unwrap().count(), 1);
        std::fs::write(&p, "not hex").unwrap();
        assert!(HeadKey::load(&p).is_err());
    }
}
