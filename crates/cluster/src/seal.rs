//! The cluster key: what nodes share and etcd does not hold.
//!
//! Everything a node writes to etcd but the owner keys is sealed with it
//! (ChaCha20-Poly1305, a random nonce per value, the etcd key as
//! associated data): sandbox rows (with their envd and traffic tokens and
//! env vars), stored-pause records and node registrations. So whoever
//! reads etcd (a backup, a member's disk, a client without the key) learns
//! no secret, and whoever writes it can neither forge a row, move a row or
//! a pause record to another sandbox's key, nor register a node that
//! other nodes would forward requests (and their API keys) to. The owner
//! keys stay plain because transactions compare them; rewriting one only
//! points a request at another real node, which refuses it.
//!
//! The key file holds at least 32 random bytes (`head -c 32 /dev/urandom`),
//! the same file on every node, readable by its owner only.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, CHACHA20_POLY1305, NONCE_LEN};
use ring::rand::{SecureRandom, SystemRandom};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// What a sealed value starts with (a format version, so that a later
/// format can be told apart).
const MAGIC: &[u8] = b"siesta-sealed-v1:";

/// The fewest bytes a key file may hold.
pub const MIN_KEY_FILE_BYTES: usize = 32;

/// The cluster's shared secret, ready to seal and open values.
pub struct ClusterKey {
    key: LessSafeKey,
    rng: SystemRandom,
}

impl std::fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterKey(..)")
    }
}

impl ClusterKey {
    /// Reads the key file at `path`, refusing one that is short or that
    /// its group or others may read.
    pub fn load(path: &Path) -> Result<Self> {
        let bad =
            |detail: String| Error::Config(format!("cluster key {}: {detail}", path.display()));
        let meta = std::fs::metadata(path).map_err(|e| bad(e.to_string()))?;
        if meta.mode() & 0o077 != 0 {
            return Err(bad(format!(
                "mode {:o} lets others read it; chmod 600 it",
                meta.mode() & 0o777
            )));
        }
        let secret = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
        if secret.len() < MIN_KEY_FILE_BYTES {
            return Err(bad(format!(
                "holds {} bytes, fewer than {MIN_KEY_FILE_BYTES}; make one with \
                 `head -c 32 /dev/urandom > FILE` and give every node the same file",
                secret.len()
            )));
        }
        Ok(Self::from_secret(&secret))
    }

    /// A key derived from `secret` (any length; the file's whole content).
    pub fn from_secret(secret: &[u8]) -> Self {
        let mut h = Sha256::new();
        h.update(b"siesta cluster key v1\0");
        h.update(secret);
        let digest = h.finalize();
        // 32 bytes is exactly ChaCha20-Poly1305's key length: cannot fail.
        let unbound = UnboundKey::new(&CHACHA20_POLY1305, &digest)
            .unwrap_or_else(|_| unreachable!("a SHA-256 digest is a ChaCha20 key"));
        Self {
            key: LessSafeKey::new(unbound),
            rng: SystemRandom::new(),
        }
    }

    /// `plain` sealed for etcd key `at`.
    pub fn seal(&self, at: &str, plain: &[u8]) -> Result<Vec<u8>> {
        let mut nonce = [0u8; NONCE_LEN];
        self.rng
            .fill(&mut nonce)
            .map_err(|_| Error::Config("the system's random source failed".into()))?;
        let mut body = plain.to_vec();
        self.key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(at.as_bytes()),
                &mut body,
            )
            .map_err(|_| Error::Config(format!("sealing {at}")))?;
        let mut out = Vec::with_capacity(MAGIC.len() + NONCE_LEN + body.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&body);
        Ok(out)
    }

    /// The value sealed for etcd key `at`, or [`Error::Unsealed`] when it
    /// was not sealed with this key for that key (forged, moved, written
    /// by a node with another cluster key, or by an older siesta).
    pub fn open(&self, at: &str, sealed: &[u8]) -> Result<Vec<u8>> {
        let refused = || Error::Unsealed {
            key: at.to_string(),
        };
        let rest = sealed.strip_prefix(MAGIC).ok_or_else(refused)?;
        if rest.len() < NONCE_LEN {
            return Err(refused());
        }
        let (nonce, body) = rest.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| refused())?;
        let mut body = body.to_vec();
        let plain = self
            .key
            .open_in_place(nonce, Aad::from(at.as_bytes()), &mut body)
            .map_err(|_| refused())?;
        Ok(plain.to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_sealed_value_opens_only_with_its_key_at_its_place() {
        let k = ClusterKey::from_secret(&[7; 32]);
        let sealed = k.seal("/siesta/sandboxes/a", b"token").unwrap();
        assert!(!sealed.windows(5).any(|w| w == b"token"));
        assert_eq!(k.open("/siesta/sandboxes/a", &sealed).unwrap(), b"token");
        // Moved to another sandbox's key.
        assert!(k.open("/siesta/sandboxes/b", &sealed).is_err());
        // Another cluster's key.
        let other = ClusterKey::from_secret(&[8; 32]);
        assert!(other.open("/siesta/sandboxes/a", &sealed).is_err());
        // Tampered with, or plain JSON as an older node wrote it.
        let mut bent = sealed.clone();
        let last = bent.len() - 1;
        bent[last] ^= 1;
        assert!(k.open("/siesta/sandboxes/a", &bent).is_err());
        assert!(k.open("/siesta/sandboxes/a", b"{\"id\":\"a\"}").is_err());
        assert!(k.open("/siesta/sandboxes/a", MAGIC).is_err());
    }

    #[test]
    fn two_seals_of_one_value_differ() {
        let k = ClusterKey::from_secret(b"0123456789abcdef0123456789abcdef");
        assert_ne!(k.seal("k", b"v").unwrap(), k.seal("k", b"v").unwrap());
    }

    #[test]
    fn a_key_file_must_be_long_and_private() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cluster.key");
        std::fs::write(&path, [1u8; 16]).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let err = ClusterKey::load(&path).unwrap_err().to_string();
        assert!(err.contains("16 bytes"), "{err}");
        std::fs::write(&path, [1u8; 32]).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = ClusterKey::load(&path).unwrap_err().to_string();
        assert!(err.contains("chmod 600"), "{err}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        ClusterKey::load(&path).unwrap();
        let missing = ClusterKey::load(&dir.path().join("none")).unwrap_err();
        assert!(missing.to_string().contains("none"), "{missing}");
    }
}
